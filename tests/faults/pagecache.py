"""Making a log cold for real: its pages out of the page cache, checked the way canopy
checks (broker/cold_reads.py): a preadv2(RWF_NOWAIT) that finds the page missing raises
BlockingIOError.

fsync, then POSIX_FADV_DONTNEED, drops a file's clean pages, but not always all of them
at once: a page the kernel still holds a reference to at that moment (one just written
back, still in a per-CPU batch) is skipped. On the 2-vCPU CI VM, in loops of a 12 MB
file written then evicted, 4 of 200 and 1 of 1 000 first tries left the probed page
cached, and a second try 0.1 s later dropped it every time. So evict() tries a few
times, then as root drops the whole page cache, and fails (never skips) when the page
still reads as cached: the test's premise would not hold. cached_bytes() counts what
the page cache holds of a file (mincore), for tests of what a read brought in."""
from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest

TRIES = 5
PAUSE_S = 0.2


def drop(files) -> None:
    """Drop the files' pages from the page cache (clean pages only: fsync first)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached(path: Path, offset: int) -> bool:
    """Whether the page at `offset` is in the page cache. (A miss starts the kernel's
    read-ahead, which brings the first 128 KiB or so around it back at once.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def cached_bytes(path: Path) -> int:
    """How much of a file the page cache holds (mincore(2) over a mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


def evict(files, probe: Path, offset: int = 0) -> None:
    """drop(files), checked: the page of `probe` at `offset` is not cached afterwards."""
    files = list(files)
    for _ in range(TRIES):
        drop(files)
        if not cached(probe, offset):
            return
        time.sleep(PAUSE_S)
    if os.geteuid() == 0:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        if not cached(probe, offset):
            return
    pytest.fail(f"could not evict {probe} (offset {offset}) from the page cache "
                f"after {TRIES} tries{' and drop_caches' if os.geteuid() == 0 else ''}")


def evict_partition(partition_dir: Path) -> None:
    """A partition's segments and indexes, checked on the first page of its first segment."""
    logs = sorted(partition_dir.glob("*.log"))
    evict(logs + sorted(partition_dir.glob("*.index")), logs[0])


def drop_partition(partition_dir: Path) -> None:
    drop(sorted(partition_dir.glob("*.log")) + sorted(partition_dir.glob("*.index")))
