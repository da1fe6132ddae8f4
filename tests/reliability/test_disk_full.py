"""Disk full: on a small tmpfs, Produce answers KAFKA_STORAGE_ERROR (56), reads keep
working, nothing on disk is corrupted, and writes resume when space returns.

mmap'd writes into a sparse file on a full filesystem raise SIGBUS (which would kill the
broker), so storage allocates blocks with posix_fallocate before writing through the
mapping; this test is what proves it. It mounts its own tmpfs (root needed; in CI a
failed mount fails the test rather than skipping it).
"""
from __future__ import annotations

import os
import subprocess

import pytest

from protocol.errors import ErrorCode
from tests.e2e.rawclient import create_topic, make_batch, produce

from .conftest import IN_CI, BrokerProcess, scale
from .helpers import read_partition, record_figures, wait_for_listener

pytestmark = pytest.mark.timeout(300)
ROUNDS = scale(1, 3)  # fill / free cycles


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        msg = f"cannot mount a tmpfs for the disk-full test: {r.stderr.strip()}"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path, limit: int) -> None:
    """Write up to ``limit`` bytes, stopping quietly when the filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        written = 0
        while written < limit:
            written += os.write(fd, b"\2" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_disk_full_answers_storage_error_and_recovers(small_fs, tmp_path):
    filler = small_fs / "filler"
    b = BrokerProcess(small_fs / "data", extra_args=["--log-level", "warning"])
    b.log_path = tmp_path / "broker.log"  # outside the full filesystem
    b.start()
    acked: dict[int, bytes] = {}
    storage_errors = 0
    try:
        c = wait_for_listener(b.bootstrap)
        create_topic(c, "full", {"segment.bytes": str(1 << 20)})
        for rnd in range(ROUNDS):
            _fill(filler, 4 << 20)  # up to 4 MiB to give back later
            i = 0
            full_at = None
            while full_at is None:
                i += 1
                # alternate the mmap path (small batches) and the pwrite path (>= 128 KiB)
                size = 300 if i % 3 else 40_000
                values = [b"%d-%d-" % (rnd, i) + b"x" * size for _ in range(4)]
                r = produce(c, "full", make_batch(values), acks=1)
                if r["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR:
                    storage_errors += 1
                    if size < 1000:  # even a small batch no longer fits: full
                        full_at = i
                    continue
                assert r["error_code"] == 0, r
                for k, v in enumerate(values):
                    acked[r["base_offset"] + k] = v
                assert i < 10_000, "the filesystem never filled up"
            # Take the last free blocks too, then the disk is full for certain: more
            # produces fail the same way and the broker stays up.
            _fill(small_fs / "rest", 1 << 40)
            # (A few small batches may still fit in pages already allocated.)
            consecutive = 0
            for k in range(200):
                v = b"%d-y%d-" % (rnd, k) + b"y" * 1000
                r = produce(c, "full", make_batch([v]), acks=1)
                if r["error_code"] == 0:
                    acked[r["base_offset"]] = v
                    consecutive = 0
                    continue
                assert r["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR, r
                storage_errors += 1
                consecutive += 1
                if consecutive == 5:
                    break
            assert consecutive == 5, "produce kept succeeding on a full disk"
            assert b.proc.poll() is None, b.log_text()
            # Reads keep working and return exactly what was acknowledged.
            rb = read_partition(c, "full")
            assert dict(rb.records) == acked
            # Space returns: writes resume at the log end offset.
            filler.unlink()
            (small_fs / "rest").unlink()
            r = produce(c, "full", make_batch([b"after-%d" % rnd]), acks=1)
            assert r["error_code"] == 0, r
            assert r["base_offset"] == rb.high_watermark
            acked[r["base_offset"]] = b"after-%d" % rnd
        c.close()
        # Nothing on disk is corrupted: a restart recovers every acknowledged record.
        b.stop()
        b.start()
        c = wait_for_listener(b.bootstrap)
        rb = read_partition(c, "full")
        assert dict(rb.records) == acked
        assert "truncated" not in b.log_text()
        c.close()
    finally:
        b.stop()
    record_figures("disk_full", fill_cycles=ROUNDS, storage_errors_answered=storage_errors,
                   records_checked=len(acked), records_lost=0)
