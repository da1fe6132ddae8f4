"""kill -9 at every step of writing a producer-state snapshot, on a real `canopy serve`.

A snapshot is written when a segment rolls: create the temp file, write it, fsync it,
rename it over `<offset>.snapshot`, fsync the directory. strace, attached to the running
broker and restricted (-P) to the one snapshot the next roll writes, delivers SIGKILL at
the entry of one of those system calls; the round after a crash then goes on on the same
data directory. Every round checks that the crash left the files that step implies, and
after the restart: every acknowledged batch is in the log at the offset it was
acknowledged with, a retry of the last acknowledged batch is answered with its original
offset (nothing appended), and the next batch in sequence is accepted.
"""
from __future__ import annotations

import os
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from broker.producer_state import decode_snapshot
from protocol.messages import ApiKey

from .conftest import BrokerProcess, require_tool
from .rawclient import RawClient, create_topic, end_offset, init_producer_id, make_batch, produce

pytestmark = pytest.mark.timeout(600)

SEGMENT_BYTES = 8192
RECORDS = 4

# step -> (strace injection, files the crash leaves: temp file bytes (None: absent), final present)
STEPS = [
    ("open temp file", "openat:signal=KILL:when=1", None, False),
    ("write temp file", "write:signal=KILL:when=1", "empty", False),
    ("fsync temp file", "fsync:signal=KILL:when=1", "whole", False),
    ("rename", "rename:signal=KILL:when=1", "whole", False),
    ("fsync directory", "fsync:signal=KILL:when=2", None, True),
    ("after the write", None, None, True),
]


def _batch(pid: int, epoch: int, seq: int) -> bytearray:
    # Same size for every batch (fixed-width values, fixed timestamps): rolls are predictable.
    return make_batch([b"s%07d-r%d-" % (seq, i) + b"x" * 200 for i in range(RECORDS)],
                      producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def _next_roll(part_dir: Path, log_end: int, batch_size: int) -> int:
    """Base offset of the segment the next roll creates: the active segment (highest
    base) holds SEGMENT_BYTES // batch_size batches of RECORDS offsets each."""
    # A partition never written has no segment yet (its first append makes the one at 0).
    base = max((int(p.name[:-4]) for p in part_dir.glob("*.log")), default=0)
    roll = base + SEGMENT_BYTES // batch_size * RECORDS
    # log_end == roll: the crash came after the batch that filled the active segment was
    # appended and before the next one rolled it; the next append rolls at log_end.
    assert base <= log_end <= roll, (base, log_end, roll)
    return roll


def _attach(strace: str, pid: int, paths: list[Path], inject: str | None, out: Path) -> subprocess.Popen:
    argv = [strace, "-f", "-o", str(out), "-e", "trace=openat,write,fsync,rename"]
    for p in paths:
        argv += ["-P", str(p)]
    if inject:
        argv += ["-e", f"inject={inject}"]
    threads = len(os.listdir(f"/proc/{pid}/task"))
    tracer = subprocess.Popen(argv + ["-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              bufsize=0)
    # strace reports each thread it attaches to (threads started later are followed by -f):
    # wait until it holds all of them, so the injection cannot miss the writer thread.
    attached, deadline = 0, time.monotonic() + 30
    while attached < threads:
        ready, _, _ = select.select([tracer.stderr], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"strace attached to {attached} of {threads} threads"
        line = tracer.stderr.readline()
        assert line, "strace exited"
        # "Process N attached" per thread, or one "Process N attached with K threads"
        many = re.search(rb"attached with (\d+) threads", line)
        attached += int(many.group(1)) if many else b"attached" in line
    return tracer


def test_kill9_at_every_step_of_snapshot_writing(tmp_path):
    strace = require_tool("strace", "Debian package strace")
    data_dir = tmp_path / "data"
    topic = "snapcrash"
    part_dir = data_dir / "topics" / topic / "0"
    acked: dict[int, int] = {}        # base_sequence -> acknowledged base offset
    batches: dict[int, bytearray] = {}
    pid = epoch = None
    seq = 0
    for step, inject, tmp_state, final_present in STEPS:
        b = BrokerProcess(data_dir).start()
        tracer = None
        try:
            c = RawClient(b.bootstrap)
            if pid is None:
                create_topic(c, topic, {"segment.bytes": str(SEGMENT_BYTES)})
                pid, epoch = init_producer_id(c)
            else:
                seq = _check_after_restart(c, topic, acked, batches, seq)
            size = len(_batch(pid, epoch, seq))
            roll = _next_roll(part_dir, end_offset(c, topic), size)
            final = part_dir / f"{roll:020d}.snapshot"
            tmp = part_dir / (final.name + ".tmp")
            tracer = _attach(strace, b.proc.pid, [tmp, final, part_dir], inject, tmp_path / f"strace-{len(acked)}.out")
            for _ in range(3 * SEGMENT_BYTES // size):
                if b.proc.poll() is not None:
                    break
                batches[seq] = _batch(pid, epoch, seq)
                try:
                    r = produce(c, topic, batches[seq], acks=1)
                except (AssertionError, OSError):
                    break   # killed while this batch was in flight: not acknowledged
                assert r["error_code"] == 0, (step, r)
                acked[seq] = r["base_offset"]
                seq += RECORDS
                if inject is None and final.exists():
                    time.sleep(0.5)   # the directory fsync follows the rename
                    b.kill9()
                    break
            else:
                pytest.fail(f"{step}: the broker was not killed by the roll at offset {roll}\n{b.log_text()}")
            b.proc.wait(30)
            assert b.proc.returncode == -9, (step, b.proc.returncode)
            tracer.wait(30)
            # the files the kill left are those of the step it hit
            if tmp_state is None:
                assert not tmp.exists(), step
            else:
                data = tmp.read_bytes()
                if tmp_state == "empty":
                    assert data == b"", step
                else:
                    assert decode_snapshot(data)[0] == roll, step
            assert final.exists() == final_present, step
            if final_present:
                assert decode_snapshot(final.read_bytes())[0] == roll
            c.close()
        finally:
            if tracer is not None and tracer.poll() is None:
                tracer.kill()
                tracer.wait(10)
            b.stop()
    # and a last clean restart over everything the crashes left
    b = BrokerProcess(data_dir).start()
    try:
        c = RawClient(b.bootstrap)
        _check_after_restart(c, topic, acked, batches, seq)
        c.close()
        assert "Traceback" not in b.log_text()
        assert not list(part_dir.glob("*.tmp"))
    finally:
        b.stop()


def _check_after_restart(c: RawClient, topic: str, acked: dict, batches: dict, next_seq: int) -> int:
    """Checks the restarted broker; returns the next base sequence."""
    # every acknowledged batch, at its offset, with its bytes
    records = _fetch_all(c, topic)
    for s, off in acked.items():
        want = [b"s%07d-r%d-" % (s, i) + b"x" * 200 for i in range(RECORDS)]
        assert [records.get(off + i) for i in range(RECORDS)] == want, f"batch seq {s} at {off}"
    end = end_offset(c, topic)
    # the last acknowledged batch, retried: its original offset, nothing appended
    last = max(acked)
    r = produce(c, topic, batches[last], acks=1)
    assert (r["error_code"], r["base_offset"]) == (0, acked[last])
    assert end_offset(c, topic) == end
    # a batch in flight at the crash is either in the log already (a duplicate) or taken now
    if next_seq in batches:
        r = produce(c, topic, batches[next_seq], acks=1)
        assert r["error_code"] == 0, r
        acked[next_seq] = r["base_offset"]
        next_seq += RECORDS
    return next_seq


def _fetch_all(c: RawClient, topic: str) -> dict[int, bytes]:
    from protocol.records import iter_records
    out: dict[int, bytes] = {}
    offset, end = 0, end_offset(c, topic)
    while offset < end:
        r = c.request(ApiKey.FETCH, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 24,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 24,
                 "current_leader_epoch": -1, "log_start_offset": -1}]}]})
        p = r["responses"][0]["partitions"][0]
        assert p["error_code"] == 0, p
        for rec in iter_records(bytes(p["records"])):
            out[rec.offset] = rec.value
            offset = rec.offset + 1
    return out
