"""The log cleaner: its throughput, and produce throughput while it runs as a ratio to
produce throughput with it idle, measured in one run on one broker.

    .venv/bin/python bench/compaction.py [--updates 400000] [--keys 20000] [--value 200]
                                         [--chunk 50000] [--size 1024]

1. `canopy serve` with the cleaner off; confluent-kafka writes UPDATES records (VALUE bytes,
   keys drawn from KEYS) to a compacted topic with 16 MiB segments, then the broker stops.
2. `canopy serve` again on the same data, cleaner on and unthrottled: it starts cleaning the
   whole topic at once. Meanwhile a producer writes CHUNK records of SIZE bytes to another
   (delete-policy) topic, chunk after chunk, until the cleaning is over; then as many chunks
   again with the cleaner idle. Produce msg/s during / after is the ratio reported.
3. Cleaner throughput is the broker's own figure (its log line "cleaned ...: read X MB,
   wrote Y MB in Z s"): MB of segments read (the offset map pass and the copy pass) per
   second of the whole cleaning, and MB of log cleaned (the original segments' size) per
   second.

Ratios, not absolute figures: this machine's 2 shared vCPUs move absolute rates by ±30 %
(bench/README.md). The broker and the producer share the 2 vCPUs with the cleaner thread,
so the ratio is the cost of cleaning for a broker on a small machine.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
CANOPY = Path(sys.executable).parent / "canopy"
CLEANED = re.compile(r"cleaned table-0 up to offset (\d+): .*read ([\d.]+) MB, wrote ([\d.]+) MB in ([\d.]+) s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp: Path, port: int, cleaner: bool) -> tuple[subprocess.Popen, object]:
    log = open(tmp / "broker.log", "ab")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CANOPY_LOG_CLEANER_ENABLE=str(cleaner).lower(),
               CANOPY_LOG_CLEANER_BACKOFF_MS="100")
    proc = subprocess.Popen([str(CANOPY), "serve", "--data-dir", str(tmp / "data"),
                             "--listen", f"127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("canopy did not start:\n" + (tmp / "broker.log").read_text())
            time.sleep(0.05)


def stop(proc, log) -> None:
    proc.terminate()
    proc.wait(60)
    log.close()


def produce(bootstrap: str, topic: str, n: int, size: int, keys: int = 0, seed: int = 0) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1, "enable.idempotence": False,
                  "queue.buffering.max.messages": 1_000_000})
    rng = random.Random(seed)
    value = b"x" * size
    errors = []

    def report(err, msg):
        if err is not None:
            errors.append(err)
    start_t = time.perf_counter()
    for i in range(n):
        key = b"key-%08d" % rng.randrange(keys) if keys else None
        while True:
            try:
                p.produce(topic, value, key=key, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(300) == 0
    if errors:
        raise SystemExit(f"produce to {topic} failed: {errors[:3]}")
    return time.perf_counter() - start_t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=400_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--value", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="canopy-bench-compaction-") as tmp:
        tmp = Path(tmp)
        port = free_port()
        bootstrap = f"127.0.0.1:{port}"
        proc, log = start(tmp, port, cleaner=False)
        try:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for topic, configs in (("table", {"cleanup.policy": "compact", "segment.bytes": str(16 << 20)}),
                                   ("load", {})):
                admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)
            produce(bootstrap, "table", args.updates, args.value, keys=args.keys, seed=1)
            print("table written", file=sys.stderr)
        finally:
            stop(proc, log)
        table_bytes = sum(f.stat().st_size for f in (tmp / "data" / "topics" / "table" / "0").glob("*.log"))

        proc, log = start(tmp, port, cleaner=True)
        try:
            during, after = [], []
            while not CLEANED.search((tmp / "broker.log").read_text()):
                during.append(produce(bootstrap, "load", args.chunk, args.size))
                print(f"chunk {len(during)} while cleaning", file=sys.stderr)
                if len(during) > 60:
                    raise SystemExit("the cleaning did not finish:\n" + (tmp / "broker.log").read_text()[-3000:])
            for i in range(max(len(during), 2)):
                after.append(produce(bootstrap, "load", args.chunk, args.size))
            print("chunks after cleaning done", file=sys.stderr)
        finally:
            stop(proc, log)
        m = CLEANED.search((tmp / "broker.log").read_text())
        read_mb, wrote_mb, secs = float(m.group(2)), float(m.group(3)), float(m.group(4))
        cleaned_bytes = sum(f.stat().st_size for f in (tmp / "data" / "topics" / "table" / "0").glob("*.log"))

    # A chunk that straddles the end of the cleaning counts as "during" (conservative).
    d_rate = args.chunk * len(during) / sum(during)
    a_rate = args.chunk * len(after) / sum(after)
    out = {"updates": args.updates, "keys": args.keys, "value": args.value, "loadavg": os.getloadavg()[0],
           "table_mb": round(table_bytes / 1e6, 1), "table_mb_after": round(cleaned_bytes / 1e6, 2),
           "cleaning_s": secs, "read_mb": read_mb, "wrote_mb": wrote_mb,
           "cleaner_read_mb_s": round(read_mb / secs, 1), "cleaner_log_mb_s": round(table_bytes / 1e6 / secs, 1),
           "produce_during_msg_s": round(d_rate), "produce_after_msg_s": round(a_rate),
           "produce_ratio": round(d_rate / a_rate, 2), "chunks": len(during)}
    print(f"{args.updates} updates of {args.value} B over {args.keys} keys ({out['table_mb']} MB of log, "
          f"{out['table_mb_after']} MB after cleaning); load average {out['loadavg']:.1f}\n")
    print("| figure | value |")
    print("|---|---|")
    print(f"| cleaning time | {secs:.1f} s |")
    print(f"| cleaner throughput, log cleaned | {out['cleaner_log_mb_s']} MB/s |")
    print(f"| cleaner throughput, segment bytes read (map + copy passes) | {out['cleaner_read_mb_s']} MB/s |")
    print(f"| produce {args.size} B records while cleaning | {d_rate:,.0f} msg/s ({len(during)} chunks of {args.chunk}) |")
    print(f"| produce with the cleaner idle | {a_rate:,.0f} msg/s |")
    print(f"| produce while cleaning / idle | {out['produce_ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
