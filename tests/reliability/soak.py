"""Soak: mixed produce / consume / rebalance against one broker for N minutes (`make soak`,
30 by default; not in CI). Samples the broker's RSS and open file descriptors every 10 s
and fails if either keeps growing, if any produce fails, or if the group does not
consume everything that was acknowledged. Results go to .cache/soak.json and
.cache/reliability-figures.jsonl (docs/reliability.md quotes them).

    python -m tests.reliability.soak --minutes 30
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import BrokerProcess
from tests.reliability.helpers import open_fds, record_figures, rss_kib

PARTITIONS = 4


class Seen:
    """Which record numbers were consumed: a bitmap (a set of 3.6 M values would cost
    the soak process a gigabyte)."""

    def __init__(self):
        self.bits = bytearray(1 << 16)
        self.count = 0

    def add(self, value: bytes) -> None:
        i = int(value.split(b"-", 2)[1])
        if i >> 3 >= len(self.bits):
            self.bits += bytearray(max(len(self.bits), (i >> 3) + 1 - len(self.bits)))
        if not self.bits[i >> 3] & (1 << (i & 7)):
            self.bits[i >> 3] |= 1 << (i & 7)
            self.count += 1

    def __len__(self) -> int:
        return self.count


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=int, default=2000, help="records per second")
    args = ap.parse_args()
    duration = args.minutes * 60
    tmp = Path(tempfile.mkdtemp(prefix="canopy-soak-"))
    b = BrokerProcess(tmp / "data", extra_args=["--log-level", "warning"]).start()
    topic, group = "soak", f"soak-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(20)
    stop = threading.Event()
    stats = {"acked": 0, "produce_errors": 0, "consumed": 0, "rebalances": 0, "consumer_errors": 0}
    seen = Seen()
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            if err is None:
                stats["acked"] += 1
            else:
                stats["produce_errors"] += 1

    def produce():
        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5})
        i = 0
        t0 = time.monotonic()
        while not stop.is_set():
            p.produce(topic, value=b"soak-%d-" % i + b"x" * 200, on_delivery=on_delivery)
            i += 1
            p.poll(0)
            ahead = i / args.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        p.flush(30)

    def on_assign(consumer, parts):
        with lock:
            stats["rebalances"] += 1

    def consume(member: int):
        while not stop.is_set():
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                          "auto.offset.reset": "earliest", "enable.auto.commit": True,
                          "session.timeout.ms": 10000})
            c.subscribe([topic], on_assign=on_assign)
            # member 0 leaves and rejoins every minute: a rebalance each time
            until = time.monotonic() + (60 if member == 0 else 1e9)
            while not stop.is_set() and time.monotonic() < until:
                msg = c.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    with lock:
                        stats["consumer_errors"] += 1
                    continue
                with lock:
                    seen.add(msg.value())
            c.close()

    samples = []
    threads = [threading.Thread(target=produce, daemon=True)] + \
        [threading.Thread(target=consume, args=(m,), daemon=True) for m in range(3)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < duration:
            time.sleep(10)
            assert b.proc.poll() is None, "broker died:\n" + b.log_text()
            with lock:
                s = {"t": round(time.monotonic() - t0), "rss_kib": rss_kib(b.proc.pid),
                     "anon_kib": rss_kib(b.proc.pid, "RssAnon"),
                     "fds": open_fds(b.proc.pid), "acked": stats["acked"], "consumed": len(seen)}
            samples.append(s)
            print(json.dumps(s), flush=True)
        stop.set()
        for t in threads:
            t.join(60)
        # let the group drain what is left
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(seen) < stats["acked"] and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                seen.add(msg.value())
        c.close()
    finally:
        stop.set()
        b.stop()
        warnings = [line for line in b.log_text().splitlines() if "WARNING" in line or "ERROR" in line]
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(samples)
    warm = samples[max(1, n // 5)] if n > 2 else samples[-1]
    tail = samples[-max(1, n // 5):]
    # heap growth (RssAnon): VmRSS also counts the mmap'd active segment's page cache
    rss_growth = max(s["anon_kib"] for s in tail) - warm["anon_kib"]
    fd_growth = max(s["fds"] for s in tail) - warm["fds"]
    result = {"minutes": args.minutes, "records_acknowledged": stats["acked"],
              "records_consumed": len(seen), "produce_errors": stats["produce_errors"],
              "consumer_errors": stats["consumer_errors"], "rebalances": stats["rebalances"],
              "rss_kib_after_warmup": warm["rss_kib"], "rss_kib_end": samples[-1]["rss_kib"],
              "anon_kib_after_warmup": warm["anon_kib"], "anon_kib_end": samples[-1]["anon_kib"],
              "anon_growth_kib": rss_growth, "fds_after_warmup": warm["fds"], "fds_end": samples[-1]["fds"],
              "fd_growth": fd_growth, "broker_warnings": len(warnings)}
    Path(".cache").mkdir(exist_ok=True)
    Path(".cache/soak.json").write_text(json.dumps({"result": result, "samples": samples}, indent=1))
    record_figures("soak", **result)
    print(json.dumps(result, indent=1))
    ok = (stats["produce_errors"] == 0 and len(seen) >= stats["acked"] and rss_growth < 64 * 1024
          and fd_growth <= 5)
    print("SOAK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
