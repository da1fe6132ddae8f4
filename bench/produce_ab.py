"""W1 produce, before/after: the same confluent-kafka load against canopy at two git
revisions, alternated in one run so machine load hits both alike.

    .venv/bin/python bench/produce_ab.py                  # HEAD vs 3ddd8c7 (before issue 14)
    .venv/bin/python bench/produce_ab.py --base REV --rounds 5 --records 200000

The base revision is unpacked with `git archive` into a temporary directory and served
from there (PYTHONPATH), the current checkout from ROOT. Each round runs W1's produce
phase (bench/kafka_load.ck_produce: 1 partition, no key, no compression, acks=1,
linger.ms=5, idempotence off: well-formed batches, so the per-batch maxTimestamp check
must cost nothing measurable) for each record size on a fresh broker of each revision.
Reported: median msg/s and broker CPU µs/msg per revision and the after/before ratios.

Before that, a deterministic micro-benchmark of the code the change added to the produce
path, on the same well-formed batches in one process: the header/CRC validation alone
(what the base revision does) against validation plus the maxTimestamp check and the
topic's timestamp bounds lookup (what the current revision does for every batch).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import ROOT, VENV, Broker  # noqa: E402
from kafka_load import ck_produce, make_topic  # noqa: E402
from progress import Progress  # noqa: E402


def serve(code_dir: Path, data_dir: str, log: Path, name: str) -> Broker:
    argv = lambda port: [str(VENV / "bin" / "python"), "-m", "broker", "serve",  # noqa: E731
                         "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}",
                         "--node-id", "0", "--flush", "async", "--log-level", "warning"]
    # cwd=ROOT for both; PYTHONPATH decides which revision's packages are imported.
    return Broker(name, argv, log, env={"PYTHONPATH": str(code_dir)})


def micro(repeat: int = 15) -> None:
    import timeit
    from types import SimpleNamespace

    from broker.handlers.produce import timestamp_bounds
    from protocol.records import build_batch, max_timestamp_needs_recompute, validate_produce_records

    topic = SimpleNamespace(configs={})
    print("| batch | validate only µs | + maxTimestamp check + bounds µs | ratio |")
    print("|---|---:|---:|---:|")
    for n, size in ((1000, 1024), (1000, 100), (10, 100), (1, 100)):
        batch = build_batch([(None, os.urandom(size), [], None) for _ in range(n)])

        def before():
            validate_produce_records(batch)

        def after():
            h = validate_produce_records(batch)
            timestamp_bounds(topic)
            max_timestamp_needs_recompute(h)

        number = 2000
        t_before = min(timeit.repeat(before, number=number, repeat=repeat)) / number * 1e6
        t_after = min(timeit.repeat(after, number=number, repeat=repeat)) / number * 1e6
        print(f"| {n} × {size} B | {t_before:.2f} | {t_after:.2f} | {t_before / t_after:.3f} |")
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="3ddd8c7", help="revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--sizes", default="1024,100")
    ap.add_argument("--micro-only", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    micro()
    if args.micro_only:
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="canopy-ab-") as tmp:
        tmp = Path(tmp)
        base_dir = tmp / "base"
        base_dir.mkdir()
        archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
        revisions = {"before": base_dir, "after": ROOT}
        results: dict = {(rev, size): [] for rev in revisions for size in sizes}
        bar = Progress("W1 produce A/B", args.rounds * len(sizes) * 2)
        for rnd in range(args.rounds):
            order = list(revisions) if rnd % 2 == 0 else list(reversed(revisions))
            for size in sizes:
                for rev in order:
                    data = tmp / f"data-{rev}-{rnd}-{size}"
                    b = serve(revisions[rev], str(data), tmp / f"{rev}.log", rev)
                    try:
                        topic = f"ab-{uuid.uuid4().hex[:6]}"
                        make_topic(b, topic)
                        results[(rev, size)].append(ck_produce(b, topic, args.records, size, bar))
                    finally:
                        b.stop()
                    bar.step(1, f"{rev} {size} B round {rnd + 1}")
        bar.close()
    print(f"\nW1 produce, {args.records} records, medians of {args.rounds} rounds "
          f"(load avg {os.getloadavg()[0]:.1f})\n")
    print("| size | before msg/s | after msg/s | ratio | before CPU µs/msg | after CPU µs/msg | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for size in sizes:
        med = {rev: statistics.median(r["msg_per_s"] for r in results[(rev, size)]) for rev in revisions}
        cpu = {rev: statistics.median(r["broker_cpu_us_per_msg"] for r in results[(rev, size)])
               for rev in revisions}
        print(f"| {size} B | {med['before']:.0f} | {med['after']:.0f} | "
              f"{med['after'] / med['before']:.3f} | {cpu['before']:.2f} | {cpu['after']:.2f} | "
              f"{cpu['after'] / cpu['before']:.3f} |")
    for size in sizes:
        for rev in revisions:
            print(f"  {rev} {size} B msg/s per round: "
                  + ", ".join(str(r["msg_per_s"]) for r in results[(rev, size)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
