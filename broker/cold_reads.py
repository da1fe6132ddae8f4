"""Fetch record bytes that are not in the page cache are read by a worker thread.

A Fetch's record bytes go from a segment file to the socket with ``os.sendfile`` on the
event loop (zero-copy). When those pages are not in the page cache, sendfile waits for
the disk inside the syscall, and the one Trio thread that serves every connection (and
the replication and failure-detector tasks riding on them) stalls with it: a catch-up
consumer reading a cold log would add the disk's latency to every other client's round
trip. So each region is sent in chunks of ``CHUNK`` bytes, and before a chunk goes out a
probe asks the kernel whether reading it would wait (``preadv2`` with ``RWF_NOWAIT``
fails with EAGAIN instead of starting I/O). A cached chunk is sent at once, as before; a
cold one is first read into the page cache by a worker thread (one of at most
``WORKERS``, so a crowd of cold readers cannot pile threads onto the disk), which also
asks the kernel to start reading the next chunk ahead (``POSIX_FADV_WILLNEED``) while
this one is being sent. The TLS listener, which must copy record bytes through Python
anyway, reads a cold chunk in the worker thread itself.

The regions' file descriptors belong to a pinned ``storage.ReadResult``: a segment that
retention, DeleteRecords or truncation removes meanwhile is unlinked, but its fds stay
open until the result is released, which the senders do only after the worker thread has
returned (``trio.to_thread.run_sync`` waits for it even when the request is cancelled).
"""
from __future__ import annotations

import errno
import os

import trio

# Regions go out in chunks this large: each is probed just before it is sent, so pages a
# worker read in have no time to be evicted again, and the disk read of the next chunk
# overlaps the send of this one. The socket takes a few MiB per sendfile anyway.
CHUNK = 4 << 20
# One probe every this many bytes of a chunk (plus its last byte): the kernel reads files
# in and evicts them in runs of pages (readahead windows of 128 KiB and more, LRU order),
# so a cold part of a chunk shows up at these points. A page missed between two probes
# costs one small disk read inside sendfile, not a stall the size of the chunk.
PROBE_STRIDE = 256 << 10
# At most this many bytes per sendfile call, with a trip through the scheduler after each:
# copying 512 KiB into a loopback socket takes ~0.3 ms of the event loop (1.8 GB/s), a
# whole 4 MiB chunk ~2.3 ms that every other connection would wait; a checkpoint costs
# ~4 µs (bench/README.md, cold reads).
SEND_SLICE = 512 << 10
# Worker threads reading cold chunks at once. Sequential reads gain nothing from more on
# one disk; a few let several catch-up readers of different logs proceed together.
WORKERS = 4

_PAGE = os.sysconf("SC_PAGE_SIZE")
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_probe_supported = bool(_RWF_NOWAIT)
_probe_buf = bytearray(1)
_limiter: trio.lowlevel.RunVar = trio.lowlevel.RunVar("cold_read_limiter")


def in_page_cache(fd: int, position: int, size: int) -> bool:
    """True when reading ``size`` bytes at ``position`` will not wait for the disk, as
    far as one byte every PROBE_STRIDE bytes (and the last one) can tell. Costs one
    ``preadv2`` syscall per probe (about a microsecond here; bench/README.md)."""
    global _probe_supported
    if not _probe_supported or size <= 0:
        return True
    end = position + size
    pos = position
    try:
        while pos < end:
            os.preadv(fd, [_probe_buf], pos, _RWF_NOWAIT)
            pos += PROBE_STRIDE
        last = end - 1
        if last // _PAGE != (last - (last - position) % PROBE_STRIDE) // _PAGE:   # a page not probed yet
            os.preadv(fd, [_probe_buf], last, _RWF_NOWAIT)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            # A filesystem or kernel without RWF_NOWAIT reads: send as canopy did before
            # the probe, and stop asking.
            _probe_supported = False
        # Anything else is for sendfile to meet and report.
    return True


def read_into_page_cache(fd: int, position: int, size: int, ahead: int = 0) -> None:
    """Worker thread: read the range so its pages are cached for sendfile (the bytes
    themselves are dropped), then have the kernel start reading the next ``ahead`` bytes
    in the background."""
    end = position + size
    while position < end:
        n = len(os.pread(fd, min(1 << 20, end - position), position))
        if n <= 0:
            return   # the segment was truncated: the sender sees it and drops the frame
        position += n
    if ahead > 0:
        try:
            os.posix_fadvise(fd, end, ahead, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass   # only a hint


def _pread_all(fd: int, size: int, position: int) -> bytes:
    out = os.pread(fd, size, position)
    if 0 < len(out) < size:   # a regular file reads short only at its end
        rest = os.pread(fd, size - len(out), position + len(out))
        out += rest
    return out


def limiter() -> trio.CapacityLimiter:
    try:
        return _limiter.get()
    except LookupError:
        lim = trio.CapacityLimiter(WORKERS)
        _limiter.set(lim)
        return lim


async def ensure_cached(fd: int, position: int, size: int, ahead: int = 0) -> None:
    """Return once [position, position+size) is in the page cache, reading it in a worker
    thread when the probe says it is not (the event loop never waits for the disk)."""
    if not in_page_cache(fd, position, size):
        await trio.to_thread.run_sync(read_into_page_cache, fd, position, size, ahead, limiter=limiter())


async def pread(fd: int, size: int, position: int) -> bytes:
    """``os.pread`` that does its disk wait in a worker thread when the range is cold."""
    if in_page_cache(fd, position, size):
        return _pread_all(fd, size, position)
    return await trio.to_thread.run_sync(_pread_all, fd, size, position, limiter=limiter())


def _read_regions(regions, into: memoryview, nowait: bool) -> bool:
    """Read the regions into ``into`` (exactly their total size); False when a segment
    reads short (the zero-copy path then meets the short file and drops the frame). With
    ``nowait``, BlockingIOError as soon as a page is not cached; without, plain ``pread``s
    (the worker threads' syscall, as in read_into_page_cache)."""
    global _probe_supported
    at = 0
    for fd, position, n in regions:
        while n > 0:
            if nowait:
                try:
                    got = os.preadv(fd, [into[at:at + n]], position, _RWF_NOWAIT)
                except BlockingIOError:
                    raise
                except OSError as e:
                    if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                        _probe_supported = nowait = False   # as in in_page_cache
                        continue
                    return False
            else:
                try:
                    chunk = os.pread(fd, n, position)
                except OSError:
                    return False
                got = len(chunk)
                into[at:at + got] = chunk
            if got <= 0:
                return False
            at += got
            position += got
            n -= got
    return at == len(into)


async def read_regions(regions, into: memoryview) -> bool:
    """Read a small response's record bytes into its frame: on the loop when every page
    is cached (each ``preadv2(RWF_NOWAIT)`` reads as it probes), else in a worker thread.
    The worker takes the whole read, not just the rest: the kernel starts read-ahead on
    a NOWAIT miss, so probing again could find pages half read in."""
    try:
        return _read_regions(regions, into, _probe_supported)
    except BlockingIOError:
        return await trio.to_thread.run_sync(_read_regions, regions, into, False, limiter=limiter())


def chunks(position: int, size: int):
    """(position, size, bytes of the region after this chunk) for each CHUNK of a region."""
    end = position + size
    while position < end:
        n = min(CHUNK, end - position)
        yield position, n, end - position - n
        position += n
