"""Produce JSON click events with event-time timestamps into a canopy topic.

    python -m pipelines.generate_clicks --bootstrap 127.0.0.1:9092 --topic clicks \
        --events 5000 --minutes 10

Each event is {"user": "u17", "page": "/pricing", "event_time": "2026-01-01T00:03:12.500Z"}.
Event times walk forward through `--minutes` minutes starting at `--start` and arrive up to
`--max-delay-s` seconds out of order (the watermark in pipelines/click_counts.py absorbs
that). The Kafka record timestamp is the event time too, so a batch read by timestamp
range selects events by when they happened. Deterministic for a given --seed, so tests
can compute the exact expected counts with `expected_counts`.
"""
from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from datetime import datetime, timedelta, timezone

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login"]
DEFAULT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def events(n: int, minutes: int, start: datetime = DEFAULT_START, seed: int = 4,
           max_delay_s: float = 20.0) -> list[dict]:
    """n events whose event times spread evenly over `minutes` minutes, shuffled locally so
    that some arrive up to max_delay_s late."""
    rng = random.Random(seed)
    span_ms = minutes * 60_000
    out = []
    for i in range(n):
        t_ms = int(i * span_ms / n)
        jitter = int(rng.uniform(0, max_delay_s) * 1000)
        arrival = t_ms + jitter
        out.append((arrival, {
            "user": f"u{rng.randrange(200)}",
            "page": rng.choice(PAGES),
            "event_time_ms": t_ms,
        }))
    out.sort(key=lambda x: x[0])
    result = []
    for _, e in out:
        ts = start + timedelta(milliseconds=e.pop("event_time_ms"))
        e["event_time"] = ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        result.append(e)
    return result


def event_time_ms(e: dict) -> int:
    ts = datetime.fromisoformat(e["event_time"].replace("Z", "+00:00"))
    return int(ts.timestamp() * 1000)


def expected_counts(evts: list[dict]) -> Counter:
    """{(window_start_ms, page): clicks} over one-minute tumbling event-time windows."""
    c: Counter = Counter()
    for e in evts:
        t = event_time_ms(e)
        c[(t - t % 60_000, e["page"])] += 1
    return c


def produce(bootstrap: str, topic: str, evts: list[dict], partitions: int | None = None) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if partitions:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        if topic not in admin.list_topics(timeout=10).topics:
            for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                f.result()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for e in evts:
        # keyed by user: one user's clicks stay in order within a partition
        p.produce(topic, key=e["user"].encode(), value=json.dumps(e).encode(),
                  timestamp=event_time_ms(e))
        p.poll(0)
    left = p.flush(60)
    if left:
        raise RuntimeError(f"{left} click events not acknowledged")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="clicks")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--start", default=DEFAULT_START.isoformat(),
                    help="event time of the first event (ISO 8601)")
    a = ap.parse_args(argv)
    start = datetime.fromisoformat(a.start)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    evts = events(a.events, a.minutes, start, a.seed)
    produce(a.bootstrap, a.topic, evts, a.partitions)
    print(f"produced {len(evts)} click events to {a.topic} "
          f"({evts[0]['event_time']} .. {evts[-1]['event_time']})")


if __name__ == "__main__":
    main()
