"""How long one partition takes to open with and without producer-state snapshots, when
batches are small (one 1 KiB record each: every batch header must be replayed without a
snapshot). In process, through broker.topics.Partition (the broker's own open path); the
log is written the way a Produce writes it (check, append, record), then closed cleanly
(snapshot at the log end). The page cache is dropped before each open where root may.

    .venv/bin/python bench/snapshot_replay.py --mib 256,512,1024 [--dir /var/tmp]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.topics import Partition, Topic  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from storage import Log  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from kafka_load import drop_caches  # noqa: E402


def _topic(d: Path) -> Topic:
    return Topic("replay", uuid.uuid4(), {}, d)


def fill(d: Path, mib: int) -> int:
    p = Partition(_topic(d), 0, Log(d / "0"))
    template = bytearray(build_batch([(None, os.urandom(1024), [], None)], producer_id=7,
                                     producer_epoch=0, base_sequence=0))
    n = (mib << 20) // len(template)
    from protocol.records import _crc32c_fn   # the CRC protocol/ uses
    for seq in range(n):
        template[53:57] = seq.to_bytes(4, "big")          # baseSequence
        template[17:21] = _crc32c_fn(template[21:]).to_bytes(4, "big")
        r = p.log.append(template, leader_epoch=0)
        p.producers.record(7, 0, seq, 0, r.base_offset, r.max_timestamp)
    p.close()
    return n


def open_seconds(d: Path) -> tuple[float, int]:
    dropped = drop_caches()
    t = time.perf_counter()
    p = Partition(_topic(d), 0, Log(d / "0"))
    secs = time.perf_counter() - t
    assert p.producers.entries[7].last_seq == p.log.log_end_offset - 1, "producer state not restored"
    p.log.close()
    return secs, dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", default="256,512,1024")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| log MiB | batches | open with snapshot s | open without snapshots s |")
    print("|---:|---:|---:|---:|")
    for mib in (int(x) for x in args.mib.split(",")):
        d = Path(tempfile.mkdtemp(prefix="snapshot-replay-", dir=args.dir))
        try:
            n = fill(d, mib)
            with_s, dropped = open_seconds(d)
            for f in (d / "0").glob("*.snapshot"):
                f.unlink()
            without_s, _ = open_seconds(d)
            print(f"| {mib} | {n:,} | {with_s:.3f} | {without_s:.3f} |"
                  + ("" if dropped else " (page cache not dropped: no root)"), flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
