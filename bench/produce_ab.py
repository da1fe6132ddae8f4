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

--warm-memory G touches and frees G GiB right before each phase, so that the page cache
grows into memory the host still backs (bench/README.md, "The VM's memory"); the VM's free
page reporting is held back while the script runs (brokers.page_reporting_held).

Before that, a steadier figure that a shared 2-vCPU machine cannot blur as much: the Produce
handler's per-partition function (produce_to_partition) of each revision, called in one
process on the same well-formed batches appending to real storage Logs (`micro`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import (ROOT, VENV, Broker, held_while_warming, load_module, unpack_revision,  # noqa: E402
                     warm_guest_memory)
from kafka_load import ck_produce, make_topic  # noqa: E402
from progress import Progress  # noqa: E402


def serve(code_dir: Path, data_dir: str, log: Path, name: str) -> Broker:
    # -P: no current directory on sys.path (cwd is ROOT for both), so PYTHONPATH alone
    # decides which revision's packages are imported.
    argv = lambda port: [str(VENV / "bin" / "python"), "-P", "-m", "broker", "serve",  # noqa: E731
                         "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}",
                         "--node-id", "0", "--flush", "async", "--log-level", "warning"]
    return Broker(name, argv, log, env={"PYTHONPATH": str(code_dir)})


def micro(base_dir: Path, repeat: int = 40, real_log: bool = True) -> list:
    """produce_to_partition of the base revision and of this checkout, called in one
    process on the same well-formed batches, appending to real storage Logs under a
    temporary directory (``real_log``) or to a stand-in whose append does nothing (the
    handler's own work alone, without the memcpy into the segment, whose cost varies by a
    few per cent with page-cache state). The handler module of each revision is loaded
    from its own file; everything below it (storage, records, producer state) is this
    checkout's, so the difference is exactly the handler's per-batch work."""
    import shutil
    import tempfile
    import time
    from types import SimpleNamespace

    import broker.handlers  # noqa: F401  (parent package for the relative imports)
    from broker.producer_state import ProducerStateTable
    from protocol.records import build_batch
    from storage.log import AppendResult, Log, LogConfig

    mods = {"before": load_module(base_dir / "broker/handlers/produce.py", "broker.handlers._produce_before"),
            "after": load_module(ROOT / "broker/handlers/produce.py", "broker.handlers._produce_after")}
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="canopy-micro-"))
    try:
        broker = SimpleNamespace(flusher=SimpleNamespace(mark_dirty=lambda lg: None),
                                 config=SimpleNamespace(min_insync_replicas=1))
        for n, size in ((1000, 1024), (100, 100), (1, 100)):
            batch = build_batch([(None, os.urandom(size), [], None) for _ in range(n)])
            calls = max(8, min(2000, (8 << 20) // len(batch)))   # ~10 ms slices
            setups = {}
            for rev in ("before", "after"):
                if real_log:
                    lg = Log(tmp / f"{rev}-{n}-{size}", LogConfig(segment_bytes=1 << 30))
                else:
                    done = AppendResult(0, n - 1, 0, 0)
                    lg = SimpleNamespace(append=lambda records, leader_epoch: done,
                                         log_start_offset=0, offline=None, close=lambda: None,
                                        config=SimpleNamespace(compact=False))
                topic = SimpleNamespace(name="micro", timestamp_type="CreateTime", configs={}, target_codec=None)
                part = SimpleNamespace(index=0, topic=topic, log=lg, replicas=[0], leader_epoch=0,
                                       producers=ProducerStateTable(),
                                       on_leader_append=lambda off: None,
                                       bytes_in=0, messages_in=0)   # /metrics counters (issue 13)
                setups[rev] = (mods[rev].produce_to_partition, part, lg)
            best = {"before": float("inf"), "after": float("inf")}
            # Many short slices, alternating: on a machine shared with other sessions the
            # minimum over slices is the uncontended cost of each revision.
            for i in range(repeat):
                for rev in (("before", "after") if i % 2 == 0 else ("after", "before")):
                    fn, part, _ = setups[rev]
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        r = fn(broker, part, batch, 9, 1)
                    best[rev] = min(best[rev], (time.perf_counter() - t0) / calls)
                    assert r["error_code"] == 0, r
            for _, _, lg in setups.values():
                lg.close()
            rows.append((f"{n} × {size} B", best["before"] * 1e6, best["after"] * 1e6))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("produce_to_partition per batch, same process, same batches, "
          + ("appending to real Logs" if real_log else "storage append stubbed out")
          + f" (best of {repeat} alternating slices each):\n")
    print("| batch | before µs | after µs | added µs | throughput ratio after/before |")
    print("|---|---:|---:|---:|---:|")
    for name, b, a in rows:
        print(f"| {name} | {b:.2f} | {a:.2f} | {a - b:+.2f} | {b / a:.3f} |")
    print()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="3ddd8c7", help="revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--sizes", default="1024,100")
    ap.add_argument("--micro-only", action="store_true")
    ap.add_argument("--warm-memory", type=float, default=0, metavar="GIB",
                    help="touch and free this many GiB of memory right before each produce phase "
                         "(this VM hands idle memory back to its host: bench/README.md, \"The VM's "
                         "memory\"); 0: off")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="canopy-ab-") as tmp, \
            held_while_warming(args.warm_memory) as page_reporting:
        tmp = Path(tmp)
        base_dir = unpack_revision(args.base, tmp / "base")
        micro(base_dir, real_log=False)
        micro(base_dir, real_log=True)
        if args.micro_only:
            return 0
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
                        warm_guest_memory(args.warm_memory)
                        results[(rev, size)].append(ck_produce(b, topic, args.records, size, bar))
                    finally:
                        b.stop()
                    bar.step(1, f"{rev} {size} B round {rnd + 1}")
        bar.close()
    print(f"\nW1 produce, {args.records} records, {args.rounds} rounds "
          f"(load avg {os.getloadavg()[0]:.1f}"
          + (f"; {args.warm_memory:g} GiB of memory warmed before each phase, free page reporting "
             f"{page_reporting}" if args.warm_memory else "")
          + ")\n")
    print("| size | before msg/s (best / median) | after msg/s (best / median) | ratio best | "
          "ratio median | CPU µs/msg before / after (median) |")
    print("|---|---:|---:|---:|---:|---:|")
    for size in sizes:
        rates = {rev: [r["msg_per_s"] for r in results[(rev, size)]] for rev in revisions}
        best = {rev: max(v) for rev, v in rates.items()}      # W1 reports the best pass
        med = {rev: statistics.median(v) for rev, v in rates.items()}
        cpu = {rev: statistics.median(r["broker_cpu_us_per_msg"] for r in results[(rev, size)])
               for rev in revisions}
        print(f"| {size} B | {best['before']:.0f} / {med['before']:.0f} | "
              f"{best['after']:.0f} / {med['after']:.0f} | {best['after'] / best['before']:.3f} | "
              f"{med['after'] / med['before']:.3f} | {cpu['before']:.2f} / {cpu['after']:.2f} |")
    print("\n| size | revision | broker CPU µs/msg min | median | max | per round |")
    print("|---|---|---:|---:|---:|---|")
    for size in sizes:
        for rev in revisions:
            cpus = [r["broker_cpu_us_per_msg"] for r in results[(rev, size)]]
            print(f"| {size} B | {rev} | {min(cpus):.2f} | {statistics.median(cpus):.2f} | {max(cpus):.2f} | "
                  + ", ".join(f"{c:.2f}" for c in cpus) + " |")
    for size in sizes:
        for rev in revisions:
            print(f"  {rev} {size} B msg/s per round: "
                  + ", ".join(str(r["msg_per_s"]) for r in results[(rev, size)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
