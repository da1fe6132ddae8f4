"""A consumer of many partitions, one of them busy: broker CPU per message, before/after.

    .venv/bin/python bench/fetch_wide.py --base REV [--partitions 1000] [--records 3000]

One confluent-kafka consumer is assigned every partition of a 1 000-partition topic (at
its end) and long-polls them all in one Fetch; one producer sends records one by one
(linger.ms=0, acks=1, a 2 ms pause after each) to partition 0 only, so every record
wakes the parked Fetch. Before issue 15's fetch change a wake-up re-read every requested
partition; after it, only those that woke. With fetch.min.bytes=1 (the clients' default)
a Fetch is answered at its first wake, so a wake-up's re-read is one of three passes over
the 1 000 partitions per record (decode, read, encode); with fetch.min.bytes=2000 one
Fetch waits for ~10 records, i.e. ~10 wake-ups. Each round runs both revisions on fresh
brokers (order alternating, as bench/produce_ab.py does; the base revision is unpacked
with `git archive` and served through PYTHONPATH). Reported: broker CPU µs per message
(utime+stime of the broker, from the producer's first send until the consumer has every
record), median and range over the rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from brokers import ROOT, unpack_revision  # noqa: E402
from kafka_load import make_topic  # noqa: E402
from produce_ab import serve  # noqa: E402


def one_run(b, partitions: int, records: int, min_bytes: int) -> float:
    topic = f"wide-{uuid.uuid4().hex[:6]}"
    make_topic(b, topic, partitions)
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"w-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 500,
                         "fetch.min.bytes": min_bytes})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": 1,
                         "enable.idempotence": False})
    producer.list_topics(topic, timeout=30)
    # Let the consumer's first fetches settle into the long poll, and the broker finish
    # the topic's creation (canopy makes partition files in a worker thread afterwards),
    # before measuring: the broker's CPU below 20 % over half a second.
    deadline, quiet = time.monotonic() + 60, 0
    while quiet < 2 and time.monotonic() < deadline:
        cpu0, t0 = b.cpu(), time.monotonic()
        while time.monotonic() - t0 < 0.5:
            consumer.poll(0.1)
        quiet = quiet + 1 if b.cpu() - cpu0 < 0.1 else 0
    got = 0
    cpu0 = b.cpu()
    for i in range(records):
        producer.produce(topic, b"x" * 100, partition=0)
        producer.poll(0)
        msg = consumer.poll(0.002)
        got += msg is not None and msg.error() is None
        time.sleep(0.002)
    producer.flush(30)
    deadline = time.monotonic() + 60
    while got < records and time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        got += msg is not None and msg.error() is None
    cpu = b.cpu() - cpu0
    consumer.close()
    if got != records:
        raise RuntimeError(f"consumed {got} of {records}")
    return cpu / records * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="git revision before the change")
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--min-bytes", default="1,2000", help="consumer fetch.min.bytes values")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="canopy-wide-") as tmp:
        tmp = Path(tmp)
        base_dir = unpack_revision(args.base, tmp / "base")
        revisions = {"before": base_dir, "after": ROOT}
        mins = [int(m) for m in args.min_bytes.split(",")]
        cpu: dict = {(rev, m): [] for rev in revisions for m in mins}
        for rnd in range(args.rounds):
            for m in mins:
                for rev in (list(revisions) if rnd % 2 == 0 else list(reversed(revisions))):
                    b = serve(revisions[rev], str(tmp / f"data-{rev}-{rnd}-{m}"), tmp / f"{rev}.log", rev)
                    try:
                        cpu[(rev, m)].append(one_run(b, args.partitions, args.records, m))
                    finally:
                        b.stop()
                    print(f"round {rnd + 1} {rev} fetch.min.bytes={m}: {cpu[(rev, m)][-1]:.0f} "
                          f"broker CPU µs/msg", flush=True)
    print(f"\n{args.partitions} partitions fetched, {args.records} records to one of them, "
          f"{args.rounds} rounds (load avg {os.getloadavg()[0]:.1f})\n")
    print("| fetch.min.bytes | before: broker CPU µs/msg median (min-max) | after | after/before |")
    print("|---:|---:|---:|---:|")
    for m in mins:
        b_, a_ = cpu[("before", m)], cpu[("after", m)]
        print(f"| {m} | {statistics.median(b_):.0f} ({min(b_):.0f}-{max(b_):.0f}) | "
              f"{statistics.median(a_):.0f} ({min(a_):.0f}-{max(a_):.0f}) | "
              f"{statistics.median(a_) / statistics.median(b_):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
