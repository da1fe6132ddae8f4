"""One log segment: ``<base>.log`` (record batches back to back) + ``<base>.index``.

``<base>.log`` holds v2 record batches exactly as they go on the wire, so a
Fetch is a sendfile of a byte range.  The active segment's file is extended
sparsely to the segment size; each batch is written at the log end with one
``pwritev`` of a patched 16-byte header (baseOffset, batchLength,
partitionLeaderEpoch) and the rest of the batch from the receive buffer, so every
page is written once and no page fault is taken.  Disk blocks are reserved ahead
in chunks.  Once rolled, a segment is trimmed to its data length.  The index is
mmap'd: entries and the commit point are stores into the mapping.

``<base>.index`` (all fields little-endian)::

    header, 64 bytes
      0  magic            8s   b"CNPYIX01"
      8  committed_length u64  bytes of valid data in .log
     16  flushed_length   u64  bytes of .log known to be fsynced
     24  created_ms       i64  wall clock at creation (segment.ms rolls by it)
     32  base_offset      i64  sanity check against the file name
     40  boot_id          16s  kernel boot id of the last session that wrote it
    entries from 64, one per batch, 32 bytes ('<qqqII')
      base_offset, last_offset, running max timestamp (of this segment),
      file position, batch size

Write order of one append: batch bytes into .log, the index entry, then
``committed_length`` with a single aligned 8-byte store.  A process killed at
any instruction therefore leaves the committed length pointing at data and
index entries that are complete in the page cache (which survives the process).
A machine crash may lose pages in any order, which is why ``flushed_length`` is
written only after an fdatasync of .log, and recovery re-checks the CRC of every
batch in (flushed_length, committed_length].

Recovery tells the two crashes apart by the kernel's boot id, stamped in the
index header whenever a segment is opened for writing.  Same boot id: only the
process died, the page cache holds every committed byte, and re-verifying
(flushed, committed] would cost seconds per partition in the default ``async``
flush policy (which never fsyncs) for nothing — only the last 64 KiB are
re-checked, as a guard.  Different boot id (or none): everything past
``flushed_length`` is CRC-checked and a torn tail truncated; what was read back
came from disk, so it then counts as flushed.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import struct
import sys
import time
from pathlib import Path

from protocol.records import (
    BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, PARTITION_LEADER_EPOCH_OFFSET, InvalidRecordBatch,
    check_batch,
)

if sys.byteorder != "little":  # the committed-length store below is a native 8-byte store
    raise ImportError("canopy's storage format assumes a little-endian host")

log = logging.getLogger("canopy.storage")


class StorageFull(OSError):
    """No space left for a write (ENOSPC/EDQUOT).  Raised *before* anything is
    written, so the segment is unchanged and the append may simply be retried
    once space returns (the broker answers KAFKA_STORAGE_ERROR meanwhile)."""


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _allocate(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks for [offset, offset+length) of a segment file.

    A full disk then fails the reservation (StorageFull) before any byte of a batch
    is written, and a failed fallocate takes no blocks, where a short write would
    keep the ones it took.  The index is written through a mapping: a store into a
    mapped page whose block cannot be allocated is SIGBUS, which kills the process,
    so its pages are always reserved first."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno in _NO_SPACE:
            raise StorageFull(e.errno, f"no space left to allocate {length} bytes: {e.strerror}") from None
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


INDEX_MAGIC = b"CNPYIX01"
INDEX_HEADER_SIZE = 64
INDEX_HEADER = struct.Struct("<8sQQqq16s")
_BOOT_ID_AT = 40
_SPARSE_AT = 56
ENTRY = struct.Struct("<qqqII")
ENTRY_SIZE = ENTRY.size  # 32
# Native 'Q' packs with one memcpy of 8 bytes, i.e. one aligned store: a kill -9
# cannot tear it.  ('<Q' would write the bytes one at a time.)
_COMMIT = struct.Struct("Q")
_COMMITTED_AT = 8
_FLUSHED_AT = 16
_Q = struct.Struct("<q")
_Q_BE = struct.Struct(">q")
# baseOffset, batchLength, partitionLeaderEpoch are adjacent: patch them with one
# pack_into (batchLength rewritten unchanged).  Outside the CRC'd range.
_PATCH = struct.Struct(">qii")
assert (BASE_OFFSET_OFFSET, BATCH_LENGTH_OFFSET, PARTITION_LEADER_EPOCH_OFFSET) == (0, 8, 12)

PAGE = mmap.PAGESIZE
# Disk blocks reserved ahead of the log end (see Segment._reserve).
_MIN_RESERVE = 16 << 10
_MAX_RESERVE = 16 << 20
_INITIAL_INDEX_ENTRIES = 256
# Same-boot recovery still re-verifies this much of a segment's tail.
SAME_BOOT_TAIL_CHECK = 64 << 10
# Recovery checks this many of an index's last entries for consistency.
INDEX_TAIL_CHECK = 4096


def _read_boot_id() -> bytes:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            import uuid
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return b""  # unknown: every recovery assumes a machine crash


BOOT_ID = _read_boot_id()

_SLOT0 = INDEX_HEADER_SIZE // 8  # first int64 slot of entry 0


def segment_name(base_offset: int) -> str:
    """Kafka's naming: the base offset zero-padded to 20 digits."""
    return f"{base_offset:020d}"


def _round_up(n: int, to: int = PAGE) -> int:
    return (n + to - 1) // to * to


class Segment:
    """A segment's files, its committed length and index.  See the module doc.

    Thread use: appends, rolls and deletion come from the log's owning thread;
    ``flush_to`` may run in a worker thread.  The owning Log serialises the
    lifetime (pins) so fds are never closed under a running fsync or sendfile.
    """

    def __init__(self, directory: Path, base_offset: int):
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = directory / (segment_name(base_offset) + ".log")
        self.index_path = directory / (segment_name(base_offset) + ".index")
        self.log_fd = -1
        self.index_fd = -1
        self.active = False       # the log's last segment, open for appends
        self._index_mm: mmap.mmap | None = None
        self._ix: memoryview | None = None    # int64 view of _index_mm (see _map_index)
        self._map_size = 0        # .log file size while active (sparse past `size`)
        self._reserved = 0        # .log bytes with disk blocks reserved (see _reserve)
        self._index_capacity = 0  # entries the .index file/mapping can hold
        self.size = 0             # committed length
        self.flushed_length = 0
        # Bumped by every truncation (owning thread). A flush in a worker thread that
        # began before a truncation must not raise flushed_length afterwards: the bytes
        # it synced may since have been cut and rewritten, and recovery trusts every byte
        # below flushed_length without a CRC check.
        self.truncations = 0
        self._flush_state = threading.Lock()
        self.entries = 0
        self.next_offset = base_offset      # last_offset + 1 of the last batch
        self.max_timestamp = -1             # running max over the segment
        self.created_ms = 0
        # lifetime: see Log._pin; fds close when deleted and unpinned
        self.pins = 0
        self.deleted = False
        self.closed = False
        self.needs_dir_sync = False
        self.recovery_verified_bytes = 0
        # Offsets may have gaps between batches (header field sparse_end != 0): a compacted
        # log. Recovery then accepts a batch whose base offset is above the previous
        # batch's last offset + 1, instead of calling it stale.
        self.sparse = False

    # -- creation / opening -------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, now_ms: int) -> "Segment":
        seg = cls(directory, base_offset)
        seg.created_ms = now_ms
        seg.log_fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            seg.index_fd = os.open(seg.index_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            seg._map_index(_INITIAL_INDEX_ENTRIES)
        except BaseException:
            seg.close()  # disk full at a roll: leave no half-made segment behind
            seg.unlink()
            raise
        seg._index_mm[:INDEX_HEADER_SIZE] = INDEX_HEADER.pack(
            INDEX_MAGIC, 0, 0, now_ms, base_offset, BOOT_ID).ljust(INDEX_HEADER_SIZE, b"\0")
        seg.needs_dir_sync = True
        return seg

    @classmethod
    def open(cls, directory: Path, base_offset: int) -> tuple["Segment", bool]:
        """Open an existing segment and run recovery on it.

        Returns (segment, truncated): ``truncated`` means recovery cut off data
        (a torn tail), so later segments cannot be trusted to follow on.
        """
        seg = cls(directory, base_offset)
        seg.log_fd = os.open(seg.log_path, os.O_RDWR)
        try:
            seg.index_fd = os.open(seg.index_path, os.O_RDWR | os.O_CREAT, 0o644)
            truncated = seg._recover()
        except BaseException:
            seg.close()
            raise
        return seg, truncated

    def _map_index(self, capacity: int) -> None:
        size = INDEX_HEADER_SIZE + capacity * ENTRY_SIZE
        # Allocate first (see _allocate): a full disk raises here, before the
        # mapping changes, instead of SIGBUS on the first store into a new page.
        if self._index_mm is None:
            _allocate(self.index_fd, 0, size)
        elif size > len(self._index_mm):
            fd = os.open(self.index_path, os.O_RDWR)
            try:
                _allocate(fd, len(self._index_mm), size - len(self._index_mm))
            finally:
                os.close(fd)
        if self._ix is not None:
            self._ix.release()  # an exported buffer would block the mremap
            self._ix = None
        if self._index_mm is None:
            os.ftruncate(self.index_fd, size)
            self._index_mm = mmap.mmap(self.index_fd, size)
            # Python's mmap keeps its own dup of the fd (it ftruncates through it
            # on resize); close ours so a sealed segment costs 2 fds, not 3.
            # Flushes reopen the file briefly (_sync_index): msync through
            # mm.flush() would hold the GIL for the whole disk write.
            os.close(self.index_fd)
            self.index_fd = -1
        else:
            self._index_mm.resize(size)  # ftruncate + mremap
        # int64 view for bisection: indexing it is ~4x cheaper than unpack_from.
        # Native order == the file's little-endian (checked at import).
        self._ix = memoryview(self._index_mm).cast("q")
        self._index_capacity = capacity

    # -- recovery -------------------------------------------------------------

    def _recover(self) -> bool:
        """Establish size/entries from the committed length, re-verifying what
        was not fsynced.  See the module doc for the reasoning."""
        file_size = os.fstat(self.log_fd).st_size
        index_size = os.fstat(self.index_fd).st_size
        header_ok = False
        committed = flushed = 0
        if index_size >= INDEX_HEADER_SIZE:
            hdr = os.pread(self.index_fd, INDEX_HEADER_SIZE, 0)
            magic, committed, flushed, created_ms, base, boot_id = INDEX_HEADER.unpack_from(hdr)
            header_ok = magic == INDEX_MAGIC and base == self.base_offset
        same_boot = header_ok and BOOT_ID != b"" and boot_id == BOOT_ID
        rebooted = header_ok and not same_boot
        if header_ok:
            self.created_ms = created_ms
            self.sparse = _Q.unpack_from(hdr, _SPARSE_AT)[0] != 0
        else:
            # Index missing or garbage: nothing is trusted, rescan the whole file.
            committed, flushed = file_size, 0
            self.created_ms = int(time.time() * 1000)
        committed = min(committed, file_size)
        flushed = min(flushed, committed)
        capacity = max(_INITIAL_INDEX_ENTRIES,
                       (max(index_size, INDEX_HEADER_SIZE) - INDEX_HEADER_SIZE) // ENTRY_SIZE)
        self._map_index(capacity)
        if not header_ok:
            self._index_mm[:INDEX_HEADER_SIZE] = INDEX_HEADER.pack(
                INDEX_MAGIC, 0, 0, self.created_ms, self.base_offset, BOOT_ID
            ).ljust(INDEX_HEADER_SIZE, b"\0")
            self._index_mm[INDEX_HEADER_SIZE:] = bytes(len(self._index_mm) - INDEX_HEADER_SIZE)

        # The bisections below touch ~log2(entries) scattered pages of the index. A plain
        # fault reads the kernel's read-ahead window around each instead (8 MiB on the CI
        # VM's disk): the whole index of a small-batch segment (7.8 MB for 245 000 one-record
        # batches) at every start. The entries the consistency check walks are asked for
        # in one go; ordinary read-ahead is back once recovery is done.
        self._index_mm.madvise(mmap.MADV_RANDOM)

        # Trusted index prefix: entries are written in order with growing end
        # positions, then at most one entry not yet covered by ``committed``,
        # then zeros — so "end <= committed and size > 0" is a monotone predicate.
        n = self._bisect_count(lambda i: self._entry_end(i) <= committed and self._entry_size(i) > 0,
                               capacity)
        # The index has no checksum: its last entries are checked for consistency
        # (contiguous offsets and positions) and must end exactly at ``committed``.
        at = (INDEX_HEADER_SIZE + max(0, n - INDEX_TAIL_CHECK - 1) * ENTRY_SIZE) // PAGE * PAGE
        self._index_mm.madvise(mmap.MADV_WILLNEED, at, INDEX_HEADER_SIZE + n * ENTRY_SIZE - at)
        good = self._consistent_prefix(n)
        rebuilt = (not header_ok and committed > 0) or good < n or (n == 0 and committed > 0) \
            or (n > 0 and self._entry_end(n - 1) != committed)
        if rebuilt:
            # Damaged index or committed length: neither is trusted beyond the
            # consistent entries; every CRC-valid batch the file holds after them
            # is re-indexed (a batch is complete before it is committed, so this
            # only ever adds whole, checked batches).
            # The consistent entries' last 64 KiB are re-derived too: the last
            # entry's own fields (its last offset, size) have nothing to check against.
            limit = self._entry_end(good - 1) - SAME_BOOT_TAIL_CHECK if good else 0
            keep = self._bisect_count(lambda i: self._entry_end(i) <= limit, good)
            committed = file_size
        else:
            # Keep the entries whose batches were fsynced (or, after a mere process
            # crash, all but the last 64 KiB); re-verify the rest from the data.
            trusted = max(flushed, committed - SAME_BOOT_TAIL_CHECK) if same_boot and n else flushed
            # The last 64 KiB are re-checked even when fsynced: a torn or scribbled
            # tail is where damage lands, and checking it costs ~1 ms per segment.
            trusted = min(trusted, committed - SAME_BOOT_TAIL_CHECK)
            keep = self._bisect_count(lambda i: self._entry_end(i) <= trusted, n)
        self._index_mm.madvise(mmap.MADV_NORMAL)
        pos = self._entry_end(keep - 1) if keep else 0
        last_offset = self._entry_last(keep - 1) if keep else self.base_offset - 1
        self.entries = keep
        self.max_timestamp = self._entry_maxts(keep - 1) if keep else -1

        # Walk the unverified tail: header sanity + CRC32C for each batch.
        truncated = False
        self.recovery_verified_bytes = committed - pos
        if committed > pos:
            with mmap.mmap(self.log_fd, committed, access=mmap.ACCESS_READ) as data:
                # Ask for exactly the bytes to verify. A plain first fault would read the
                # kernel's window around it instead, half of read_ahead_kb behind the
                # page: with an 8 MiB read-ahead that was ~4 MiB per segment at every
                # start (75 MB of a 10 GiB log's 16 segments, before any request), while
                # the tail checked after a clean stop is 64 KiB and a batch. The kernel
                # caps the advice at one read-ahead window; a longer tail (recovery after
                # a reboot) goes on with ordinary faults.
                at = pos // PAGE * PAGE
                data.madvise(mmap.MADV_WILLNEED, at, committed - at)
                while pos < committed:
                    try:
                        h = check_batch(data, pos, committed, strict=False, check_crc=True)
                    except InvalidRecordBatch:
                        truncated = True
                        break
                    if h.base_offset != last_offset + 1 and not (
                            self.sparse and h.base_offset > last_offset):
                        # offsets are contiguous (unless the segment is compacted): a
                        # stale, foreign or scribbled-on batch (baseOffset is outside the CRC)
                        truncated = True
                        break
                    self._put_entry(h.base_offset, h.last_offset, h.max_timestamp, pos, h.total_size)
                    last_offset = h.last_offset
                    pos += h.total_size
        # Anything in the file past ``pos`` is a torn write or preallocation.
        if rebuilt:
            log.warning("%s: index missing or inconsistent with the committed length; rebuilt "
                        "from the segment (%d batches)", self.index_path, self.entries)
        if truncated:
            log.warning("%s: truncated a torn or corrupt tail at byte %d: %d bytes dropped of "
                        "committed length %d; log end offset of this segment now %d",
                        self.log_path, pos, committed - pos, committed, last_offset + 1)
        self.size = pos
        self.next_offset = last_offset + 1
        # After a reboot, every byte kept was just read back from disk: durable.
        self.flushed_length = pos if rebooted else min(flushed, pos)
        _COMMIT.pack_into(self._index_mm, _COMMITTED_AT, pos)
        _COMMIT.pack_into(self._index_mm, _FLUSHED_AT, self.flushed_length)
        self._zero_index_from(self.entries)
        if file_size != pos:
            os.ftruncate(self.log_fd, pos)
        return truncated

    def _consistent_prefix(self, n: int) -> int:
        """How many of the first ``n`` index entries are consistent with each
        other: contiguous offsets and positions, positive sizes, a running max
        timestamp that never falls.  Only the last INDEX_TAIL_CHECK entries are
        examined (the first one too), keeping restarts of big logs fast; damage
        is expected where the last writes were."""
        if n == 0:
            return 0
        ix, s = self._ix, _SLOT0
        first = max(0, n - INDEX_TAIL_CHECK)
        if self._entry_base(0) < self.base_offset or self._entry_pos(0) != 0:
            return 0
        prev_last = self._entry_last(first - 1) if first else self._entry_base(0) - 1
        prev_end = self._entry_end(first - 1) if first else 0
        prev_ts = self._entry_maxts(first - 1) if first else -(1 << 63)
        for i in range(first, n):
            base, last, ts, v = ix[s + 4 * i], ix[s + 4 * i + 1], ix[s + 4 * i + 2], ix[s + 4 * i + 3]
            pos, size = v & 0xFFFFFFFF, v >> 32
            if (base != prev_last + 1 and not (self.sparse and base > prev_last)) or last < base \
                    or pos != prev_end or size <= 0 or ts < prev_ts:
                return i
            prev_last, prev_end, prev_ts = last, pos + size, ts
        return n

    def _bisect_count(self, pred, hi: int) -> int:
        lo = 0
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _zero_index_from(self, i: int) -> None:
        start = INDEX_HEADER_SIZE + i * ENTRY_SIZE
        end = len(self._index_mm)
        if start < end:
            self._index_mm[start:end] = bytes(end - start)

    # -- index entry accessors ---------------------------------------------------
    # Entry i occupies int64 slots 8+4i .. 11+4i of the index: base offset, last
    # offset, running max timestamp, then position (low 32 bits) and size (high).

    def _entry_base(self, i: int) -> int:
        return self._ix[_SLOT0 + 4 * i]

    def _entry_last(self, i: int) -> int:
        return self._ix[_SLOT0 + 4 * i + 1]

    def _entry_maxts(self, i: int) -> int:
        return self._ix[_SLOT0 + 4 * i + 2]

    def _entry_pos(self, i: int) -> int:
        return self._ix[_SLOT0 + 4 * i + 3] & 0xFFFFFFFF

    def _entry_size(self, i: int) -> int:
        return self._ix[_SLOT0 + 4 * i + 3] >> 32

    def _entry_end(self, i: int) -> int:
        v = self._ix[_SLOT0 + 4 * i + 3]
        return (v & 0xFFFFFFFF) + (v >> 32)

    def entry(self, i: int) -> tuple[int, int, int, int, int]:
        """(base_offset, last_offset, running_max_timestamp, position, size)."""
        return ENTRY.unpack_from(self._index_mm, INDEX_HEADER_SIZE + i * ENTRY_SIZE)

    def _put_entry(self, base: int, last: int, max_ts: int, pos: int, size: int) -> None:
        n = self.entries
        if n >= self._index_capacity:
            self._map_index(self._index_capacity * 2)
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        ENTRY.pack_into(self._index_mm, INDEX_HEADER_SIZE + n * ENTRY_SIZE,
                        base, last, self.max_timestamp, pos, size)
        self.entries = n + 1

    # -- lookups ----------------------------------------------------------------

    def _first_at_least(self, slot: int, value: int, lo: int = 0) -> int:
        """Index of the first entry from ``lo`` whose int64 field ``slot`` (0 base
        offset, 1 last offset, 2 running max timestamp) is >= value; the fields are
        non-decreasing along the index, so this is a bisection."""
        ix = self._ix
        hi = self.entries
        first = _SLOT0 + slot
        while lo < hi:
            mid = (lo + hi) >> 1
            if ix[first + 4 * mid] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find_offset(self, offset: int) -> int:
        """Index of the first batch whose last offset >= offset (== entries if none)."""
        return self._first_at_least(1, offset)

    def find_base_below(self, upper_offset: int, lo: int) -> int:
        """Number of entries (from 0) whose base offset < upper_offset, searching from lo."""
        return self._first_at_least(0, upper_offset, lo)

    def find_end_within(self, limit_end: int, lo: int, hi: int) -> int:
        """Number of entries (from 0, searching [lo, hi)) ending at or before limit_end."""
        ix = self._ix
        while lo < hi:
            mid = (lo + hi) >> 1
            v = ix[_SLOT0 + 3 + 4 * mid]
            if (v & 0xFFFFFFFF) + (v >> 32) <= limit_end:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find_timestamp(self, ts: int) -> int:
        """Index of the first batch whose running max timestamp >= ts: that batch
        holds a record with timestamp >= ts and no earlier batch does."""
        return self._first_at_least(2, ts)

    def read_at(self, pos: int, size: int) -> bytes:
        return os.pread(self.log_fd, size, pos)

    # -- appending (active segment only) --------------------------------------

    def activate(self, map_size: int) -> None:
        """Make this the active segment: extend the file sparsely to ``map_size``
        (so appends inside it never change the file size, a metadata update per
        write otherwise).  Sparse extension costs no disk blocks; they are
        reserved ahead of the writes (see _reserve)."""
        map_size = _round_up(max(map_size, self.size + 1))
        # Writes in this boot follow: a later recovery must know which boot
        # made them (see the module doc).
        self._index_mm[_BOOT_ID_AT:_BOOT_ID_AT + 16] = BOOT_ID.ljust(16, b"\0")
        os.ftruncate(self.log_fd, map_size)
        self.active = True
        self._map_size = map_size
        self._reserved = self.size // PAGE * PAGE

    def can_fit(self, nbytes: int) -> bool:
        return self.size + nbytes <= self._map_size

    def _reserve(self, end: int) -> None:
        # Reserve disk blocks roughly as much as was written so far ahead (16 KiB..16
        # MiB): one fallocate per chunk instead of one per batch. A busy partition gets
        # big chunks, thousands of idle ones stay small. A full disk then fails here,
        # before any byte of the batch is written.
        chunk = min(_MAX_RESERVE, max(_MIN_RESERVE, _round_up(self.size)))
        target = min(self._map_size, _round_up(end + chunk))
        try:
            _allocate(self.log_fd, self._reserved, target - self._reserved)
        except StorageFull:
            # Not enough room for the whole chunk: reserve just this write
            # (raises StorageFull again when even that does not fit).
            target = _round_up(end)
            _allocate(self.log_fd, self._reserved, target - self._reserved)
        self._reserved = target

    def append(self, batch, base_offset: int, last_offset: int, max_timestamp: int,
               leader_epoch: int | None) -> int:
        """Write one batch at the log end, index it, then commit.  Returns its position.

        One ``pwritev`` puts each byte in the page cache exactly once: the leader's
        baseOffset and partitionLeaderEpoch (outside the CRC'd range) go in a 16-byte
        patched header, followed by the rest of the batch straight from the receive
        buffer.  (Copying through a mapping of the file instead wrote every page twice,
        zeros to pre-fault it and then the batch, and stores into pages under writeback
        took a page fault each: the ~3 µs/record "slow mode" of issue 15.)  Replicated
        batches (leader_epoch None) already carry their offsets and are written as they
        came.  (The hot path: kept inline.)"""
        pos = self.size
        n = len(batch)
        end = pos + n
        i = self.entries
        if base_offset != self.next_offset and not self.sparse:
            # A follower copying a compacted log across a gap: flag the segment before
            # the batch is committed, so recovery accepts the gap.
            self.mark_sparse(-1)
        if i >= self._index_capacity:
            # before the data: a full disk must fail the append, not tear it
            self._map_index(self._index_capacity * 2)
        if end > self._reserved:
            self._reserve(end)
        try:
            if leader_epoch is None:
                written = os.pwrite(self.log_fd, batch, pos)
            else:
                # baseOffset, batchLength (unchanged), partitionLeaderEpoch in one header
                written = os.pwritev(self.log_fd, (_PATCH.pack(base_offset, n - 12, leader_epoch),
                                                   memoryview(batch)[_PATCH.size:]), pos)
        except OSError as e:
            if e.errno in _NO_SPACE:
                raise StorageFull(e.errno, f"no space left to write {n} bytes: {e.strerror}") from None
            raise
        if written != n:  # short write: the disk filled up part way; nothing is committed
            raise StorageFull(errno.ENOSPC, f"no space left: wrote {written} of {n} bytes")
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        idx = self._index_mm
        ENTRY.pack_into(idx, INDEX_HEADER_SIZE + i * ENTRY_SIZE,
                        base_offset, last_offset, self.max_timestamp, pos, n)
        self.entries = i + 1
        # The commit point: one aligned 8-byte store, after data and index entry.
        _COMMIT.pack_into(idx, _COMMITTED_AT, end)
        self.size = end
        self.next_offset = last_offset + 1
        return pos

    def mark_sparse(self, sparse_end: int) -> None:
        self.sparse = True
        _Q.pack_into(self._index_mm, _SPARSE_AT, sparse_end)

    def sparse_end(self) -> int:
        return _Q.unpack_from(self._index_mm, _SPARSE_AT)[0]

    def truncate_entries(self, keep: int) -> None:
        """Drop entries [keep:] and their data (replication truncation)."""
        new_size = self._entry_end(keep - 1) if keep else 0
        self.entries = keep
        self.max_timestamp = self._entry_maxts(keep - 1) if keep else -1
        self.next_offset = self._entry_last(keep - 1) + 1 if keep else self.base_offset
        with self._flush_state:
            self.truncations += 1
            _COMMIT.pack_into(self._index_mm, _COMMITTED_AT, new_size)
            if self.flushed_length > new_size:
                self.flushed_length = new_size
                _COMMIT.pack_into(self._index_mm, _FLUSHED_AT, new_size)
        self._zero_index_from(keep)
        self.size = new_size
        # Make the lower committed/flushed lengths durable before new data can
        # reuse the space: recovery trusts bytes below flushed_length unchecked.
        self._sync_index()
        map_size = self._map_size
        self.active = False
        # Shrinking then re-extending the file zeroes the dropped bytes, so the
        # area past `size` is clean preallocation again.
        os.ftruncate(self.log_fd, new_size)
        if map_size:
            self.activate(map_size)

    def seal(self) -> None:
        """Stop being the active segment: trim the sparse tail so the file is
        exactly its data (Kafka trims preallocated segments on roll)."""
        self.active = False
        os.ftruncate(self.log_fd, self.size)
        self._map_size = self._reserved = 0
        # the index file keeps spare capacity mapped; trim it too
        cap = max(self.entries, 1)
        if cap < self._index_capacity:
            self._map_index(cap)

    # -- durability ---------------------------------------------------------

    def flush_to(self, committed: int) -> None:
        """fsync .log, then record flushed_length and fsync .index (see module doc).
        May run in a worker thread while the owning thread appends."""
        if committed <= self.flushed_length:
            return
        generation = self.truncations
        os.fdatasync(self.log_fd)
        with self._flush_state:
            if generation != self.truncations or committed > self.size:
                return   # truncated meanwhile: what was synced is no longer what is there
            self.flushed_length = committed
            try:
                _COMMIT.pack_into(self._index_mm, _FLUSHED_AT, committed)
            except (ValueError, TypeError):  # closed by a concurrent close()
                return
        self._sync_index()

    def _sync_index(self) -> None:
        """fdatasync the index file (entries, committed and flushed lengths).
        fsync works per inode, so a fresh fd covers pages dirtied via the mapping."""
        try:
            fd = os.open(self.index_path, os.O_RDONLY)
        except FileNotFoundError:
            return  # deleted meanwhile (retention): nothing left to make durable
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._ix is not None:
            self._ix.release()
            self._ix = None
        if self._index_mm is not None:
            try:
                self._index_mm.close()
            except BufferError:
                pass
        self._index_mm = None
        for fd in (self.log_fd, self.index_fd):
            if fd >= 0:
                os.close(fd)
        self.log_fd = self.index_fd = -1

    def unlink(self) -> None:
        for p in (self.log_path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return (f"Segment(base_offset={self.base_offset}, size={self.size}, "
                f"entries={self.entries}, next_offset={self.next_offset})")
