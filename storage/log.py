"""One partition's log: a directory of segments, recovered on open.

Directory layout::

    00000000000000000000.log     record batches back to back (see segment.py)
    00000000000000000000.index   committed length + one 32-byte entry per batch
    00000000000000123456.log     next segment, named by its base offset
    ...
    log-start-offset.checkpoint  the log start offset (DeleteRecords, retention)

A log that has never been written has no directory and no files: they are made at its
first append (``_create_files``), or just before by a worker thread that the broker starts
after CreateTopics (``make_files_ahead``, which only creates what is missing). A topic of 1 000 partitions is then created with a
handful of file operations instead of ~10 per partition (a directory, two files, an
index allocation and mappings each: 0.6 s here), and its idle partitions hold no
file descriptors. Nothing is lost by a crash meanwhile: the topic's partition count is
in topic.json (broker/topics.py), and a partition whose directory is missing opens as
an empty log, which is all it was. Kafka creates the segment eagerly; its
preallocation is lazy, as canopy's block reservation is (segment.py).

Threading: every method except ``flush`` and ``make_files_ahead`` must be called from one
thread (the broker's Trio thread).  ``flush`` may run in a worker thread concurrently with
appends: it only reads plain attributes (atomic under the GIL) and fsyncs fds.
``self._lock`` guards segment lifetimes: a segment removed by retention,
DeleteRecords or truncation is unlinked at once but its fds stay open while a
flush or a ReadResult (a pending sendfile) pins it; the last unpin closes them.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

from protocol.records import (
    HEADER_STRUCT, MESSAGE_TOO_LARGE, BatchHeader, InvalidRecordBatch,
    iter_records, validate_batches, LOG_OVERHEAD,
)

from .cleaner import CLEANER_CHECKPOINT, complete_interrupted_swaps
from .files import fsync_path
from .segment import Segment, segment_name

_make_header = BatchHeader._make

CHECKPOINT = "log-start-offset.checkpoint"
# Kafka's segment.bytes is an int; our index stores 32-bit positions.
MAX_SEGMENT_BYTES = (1 << 31) - 1
# batchLength @8, lastOffsetDelta @23, maxTimestamp @35: all append needs
_APPEND_FIELDS = struct.Struct(">8xi11xi8xq")
# iter_batch_headers reads batches averaging more than this one header at a time
_HEADER_READ_SPAN = 16 << 10


class StorageError(Exception):
    """Base class of storage exceptions."""


class OffsetOutOfRange(StorageError):
    """fetch offset < log start offset or > log end offset (Kafka error 1)."""

    error_code = 1

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(f"offset {offset} is outside the log "
                         f"[{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class LogOffline(StorageError):
    """An fsync of this log failed: it is offline until the broker restarts (Kafka takes
    a log directory offline on any I/O error). After a failed fsync the kernel may have
    dropped the dirty pages, so nothing written since the last good fsync can be trusted
    or acknowledged; appends and reads raise this (KAFKA_STORAGE_ERROR, 56)."""

    error_code = 56


def now_ms() -> int:
    return int(time.time() * 1000)


def make_files_ahead(directory: Path | str, base_offset: int = 0, wanted=lambda: True) -> None:
    """For a worker thread, right after a topic is created: make a never-written log's
    directory and its first segment's two files, empty, so that its first append finds
    them (creating a directory and two inodes costs ~1 ms of kernel time here, which a
    produce to 1 000 new partitions would otherwise pay on the event loop). Only creates
    what does not exist (O_EXCL), never writes or truncates: whatever the owning thread
    has made meanwhile stands, and ``wanted()`` false (it began writing, or the log was
    closed) stops early. An empty segment left here by a crash opens as an empty log."""
    if not wanted():
        return
    try:
        os.mkdir(directory)
    except FileExistsError:
        pass
    except FileNotFoundError:
        return   # the topic was deleted meanwhile
    name = segment_name(base_offset)
    for suffix in (".log", ".index"):
        if not wanted():
            return
        try:
            os.close(os.open(os.path.join(directory, name + suffix), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
        except (FileExistsError, FileNotFoundError):
            pass


@dataclass
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000   # -1: keep forever
    retention_bytes: int = -1                   # -1: no size limit
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"  # or "LogAppendTime" (applied by the caller)
    cleanup_policy: str = "delete"              # delete | compact | compact,delete
    # compaction (storage/cleaner.py), Kafka's defaults
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = (1 << 63) - 1
    delete_retention_ms: int = 24 * 3600 * 1000

    def __post_init__(self):
        # Kafka's segment.bytes is an int32; the index stores 32-bit positions.
        self.segment_bytes = max(1, min(self.segment_bytes, MAX_SEGMENT_BYTES))

    @classmethod
    def from_topic_configs(cls, configs: dict[str, str] | None) -> "LogConfig":
        """Build from Kafka topic config names; unknown names are ignored
        (the broker keeps them for DescribeConfigs)."""
        kw = {}
        for name, value in (configs or {}).items():
            spec = _KAFKA_CONFIG_NAMES.get(name)
            if spec is None or value is None:
                continue
            attr, conv = spec
            kw[attr] = conv(value)
        return cls(**kw)

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        # a substring test: Produce asks on every request; the values are delete, compact
        # and compact,delete (validated by the broker)
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Retention by time and size applies (Kafka ignores retention.ms/bytes on a
        topic whose cleanup.policy is compact alone)."""
        return "delete" in self.cleanup_policy

    @property
    def roll_ms(self) -> int:
        """segment.ms, lowered to max.compaction.lag.ms on a compacted topic: the active
        segment is never cleaned, so it must roll for a record to be compacted in time
        (KIP-354)."""
        if self.compact and 0 <= self.max_compaction_lag_ms < self.segment_ms:
            return self.max_compaction_lag_ms
        return self.segment_ms


# Kafka topic config name -> (LogConfig attribute, parser)
_KAFKA_CONFIG_NAMES = {
    "segment.bytes": ("segment_bytes", int),
    "segment.ms": ("segment_ms", int),
    "retention.ms": ("retention_ms", int),
    "retention.bytes": ("retention_bytes", int),
    "max.message.bytes": ("max_message_bytes", int),
    "message.timestamp.type": ("message_timestamp_type", str),
    "cleanup.policy": ("cleanup_policy", str),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", float),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", int),
    "delete.retention.ms": ("delete_retention_ms", int),
}


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int
    max_timestamp: int
    position: int        # file position of the batch in its segment


class ReadResult:
    """Batches for a fetch, as file regions for os.sendfile.

    ``regions`` is a list of (fileno, position, size).  The fds stay valid while
    this object is alive (it pins its segments against deletion); drop it, or
    call ``release()``, once the bytes are sent.
    """

    __slots__ = ("regions", "size", "_log", "_segments", "__weakref__")

    def __init__(self, log: "Log | None", segments: list, regions: list):
        self.regions = regions
        self.size = sum(r[2] for r in regions)
        self._log = log
        self._segments = segments

    def read_bytes(self) -> bytes:
        out = bytearray()
        for fd, pos, size in self.regions:
            while size:
                chunk = os.pread(fd, size, pos)
                if not chunk:
                    raise StorageError("segment shorter than its committed length")
                out += chunk
                pos += len(chunk)
                size -= len(chunk)
        return bytes(out)

    def release(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            log._unpin(self._segments)
            self._segments = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass

    def __bool__(self) -> bool:
        return self.size > 0

    def __repr__(self) -> str:
        return f"ReadResult(size={self.size}, regions={self.regions})"


_EMPTY_SEGMENTS: list = []


class Log:
    """A partition's log.  See the module doc for layout and threading."""

    # What every log starts with, as class attributes until first assigned: CreateTopics
    # of 1 000 partitions opens 1 000 logs before it answers.
    _closed = False
    flushed_offset = 0
    truncations = 0                 # bumped by truncate_to (see flush)
    offline: str | None = None      # why, once an fsync failed (LogOffline)
    _checkpoint_unsynced = False
    recovered_truncations = 0       # torn tails cut by recovery (for logs/tests)
    # The directory was made by this process and its entry in the topic directory
    # is not fsynced yet: the next flush does it (see _create_files).
    _parent_unsynced = False
    # Called with the new segment's base offset after every roll: the broker snapshots
    # its producer state there (Kafka takes its producer-state snapshot at roll).
    on_roll = None

    def __init__(self, directory: Path | str, config: LogConfig | None = None, *, new: bool = False):
        """Open the log in ``directory``, recovering what is there. ``new``: the caller
        knows nothing is there (its topic directory was made just now), so the log starts
        empty at offset 0 without asking the file system, and a ``str`` directory becomes
        a Path only when first used: CreateTopics of 1 000 partitions otherwise spends
        ~5 µs per partition on a stat and a pathlib parse."""
        self._directory = directory
        self.config = config or LogConfig()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._segments: list[Segment] = []
        self._bases: list[int] = []     # base offsets, parallel to _segments
        if new:
            # Never written (see the module doc): empty at offset 0, files at first append.
            self.log_start_offset = self.log_end_offset = 0
        else:
            self._load()

    @property
    def directory(self) -> Path:
        d = self._directory
        if type(d) is str:
            # Benign race: make_files_ahead's worker may get here first; both make the
            # same Path.
            d = self._directory = Path(d)
        return d

    # -- open / recovery ----------------------------------------------------

    def _read_checkpoint(self) -> int:
        try:
            return int((self.directory / CHECKPOINT).read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return 0

    def _write_checkpoint(self, offset: int) -> None:
        """Write-then-rename: a process crash leaves the old or the new value. The fsyncs
        are left to the next ``flush`` (a worker thread under the interval/always policies):
        this runs on the broker's event loop (retention, DeleteRecords), where two fsyncs
        would stall every connection. Kafka likewise checkpoints the log start offset
        asynchronously. Should a machine crash lose the file, recovery falls back to the
        first segment's base offset."""
        tmp = self.directory / (CHECKPOINT + ".tmp")
        with open(tmp, "w") as f:
            f.write(f"{offset}\n")
        os.replace(tmp, self.directory / CHECKPOINT)
        self._checkpoint_unsynced = True

    def _sync_checkpoint(self) -> None:
        self._checkpoint_unsynced = False
        try:
            fd = os.open(self.directory / CHECKPOINT, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fsync_path(self.directory)

    def _load(self) -> None:
        if not self.directory.is_dir():
            # Never written (see the module doc): empty at offset 0, files at first append.
            self.log_start_offset = self.log_end_offset = self.flushed_offset = 0
            return
        # A compaction swap interrupted by a crash is finished or undone first (cleaner.py).
        complete_interrupted_swaps(self.directory)
        bases = []
        for p in self.directory.iterdir():
            name = p.name
            if name == CHECKPOINT + ".tmp":
                p.unlink()  # a checkpoint write interrupted before its rename
            elif name.endswith(".log") and name[:-4].isdigit():
                bases.append(int(name[:-4]))
        bases.sort()
        # .index files without a .log are leftovers of an interrupted delete
        for p in self.directory.glob("*.index"):
            if p.name[:-6].isdigit() and int(p.name[:-6]) not in bases:
                p.unlink()
        checkpoint = self._read_checkpoint()
        truncate_rest = False
        for base in bases:
            if truncate_rest:
                # An earlier segment lost its tail: whatever follows is not
                # contiguous with it any more (Kafka deletes it as well).
                Segment(self.directory, base).unlink()
                continue
            seg, truncated = Segment.open(self.directory, base)
            if truncated:
                self.recovered_truncations += 1
            if self._segments and seg.base_offset < self._segments[-1].next_offset:
                seg.close()
                seg.unlink()
                truncate_rest = True
                continue
            self._segments.append(seg)
            truncate_rest = truncated
        # Drop empty segments other than the last; they only arise from crashes
        # right after a roll.
        while len(self._segments) > 1 and self._segments[-1].size == 0 \
                and self._segments[-2].size == 0:
            dead = self._segments.pop(-2)
            dead.close()
            dead.unlink()
        if not self._segments:
            seg = Segment.create(self.directory, checkpoint, now_ms())
            self._segments.append(seg)
        self._bases = [s.base_offset for s in self._segments]
        self.log_start_offset = max(checkpoint, self._segments[0].base_offset)
        active = self._segments[-1]
        self.log_end_offset = active.next_offset
        if active.entries == 0 and active.base_offset > self.log_end_offset:
            self.log_end_offset = active.base_offset
        # Reopening continues the last segment (Kafka does the same).
        active.activate(self.config.segment_bytes)
        self.flushed_offset = self.log_end_offset if all(
            s.flushed_length >= s.size for s in self._segments) else self.log_start_offset

    def _create_files(self) -> Segment:
        """The first segment of a log that has no files yet (see the module doc), at the
        log end offset. The directory's entry in the topic directory is made durable by
        the next flush, as the new segment's entries are: under flush=always/interval
        that precedes any acknowledgement that depends on it, and under async a machine
        crash that loses the directory loses only unflushed records, which async allows."""
        self._ensure_directory()
        seg = Segment.create(self.directory, self.log_end_offset, now_ms())
        seg.activate(self.config.segment_bytes)
        with self._lock:
            self._segments.append(seg)
            self._bases.append(seg.base_offset)
        return seg

    def _ensure_directory(self) -> None:
        # Not parents=True: a missing topic directory means the topic was deleted. The
        # directory may exist already without any segment (made by make_files_ahead, or
        # emptied by a crash): its entry is fsynced by the next flush either way.
        try:
            self.directory.mkdir()
        except FileExistsError:
            pass
        self._parent_unsynced = True

    def make_files_ahead(self) -> None:
        """For a worker thread, right after the topic is created: make this never-written
        log's files (the module's ``make_files_ahead``), unless the owning thread has begun
        writing it or closed it meanwhile. Touches no state of this object."""
        make_files_ahead(self.directory, self.log_end_offset, lambda: not (self._segments or self._closed))

    @property
    def has_files(self) -> bool:
        """False for a log never written to (no directory, no segment yet)."""
        return bool(self._segments)

    @property
    def active_segment(self) -> Segment:
        return self._segments[-1] if self._segments else self._create_files()

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # -- appends ------------------------------------------------------------

    def append(self, batch, *, leader_epoch: int, now_ms: int | None = None) -> AppendResult:
        """Append ONE already-validated v2 batch as the leader.

        The batch is copied into the active segment's mapping and its
        baseOffset (= log end offset) and partitionLeaderEpoch are patched there
        — both lie outside the CRC'd range, so no per-record work.  LogAppendTime
        is the caller's job (set_log_append_time) before this call.
        """
        if self.offline:
            raise LogOffline(self.offline)
        batch_length, last_offset_delta, max_timestamp = _APPEND_FIELDS.unpack_from(batch, 0)
        size = batch_length + LOG_OVERHEAD
        if size != len(batch):
            raise InvalidRecordBatch(f"batch length {size} != {len(batch)} bytes given")
        if size > self.config.max_message_bytes:
            raise InvalidRecordBatch(
                f"batch of {size} bytes exceeds max.message.bytes {self.config.max_message_bytes}",
                MESSAGE_TOO_LARGE)
        segs = self._segments
        seg = segs[-1] if segs else self._create_files()
        if seg.size and (seg.size + size > self.config.segment_bytes or self._segment_too_old(seg, now_ms)) \
                or not seg.can_fit(size):
            seg = self._segment_for_append(size, now_ms)
        base = self.log_end_offset
        last = base + last_offset_delta
        pos = seg.append(batch, base, last, max_timestamp, leader_epoch)
        self.log_end_offset = last + 1
        return AppendResult(base, last, max_timestamp, pos)

    def append_replicated(self, batches) -> AppendResult:
        """Follower path: append one or more batches (back to back, as they come
        in a Fetch response) keeping their own offsets and bytes.

        Headers and CRCs are checked (the bytes come off the network).  Each
        batch's base offset must be >= the log end offset: equal normally,
        greater only when the upstream's log has gaps (compaction).
        """
        if self.offline:
            raise LogOffline(self.offline)
        headers = validate_batches(batches, strict=False)
        if not headers:
            raise InvalidRecordBatch("no record batch to append")
        mv = memoryview(batches)
        first = None
        result = None
        try:
            for h in headers:
                if h.base_offset < self.log_end_offset:
                    raise InvalidRecordBatch(
                        f"replicated batch at offset {h.base_offset} is below the log end "
                        f"offset {self.log_end_offset}")
                seg = self._segment_for_append(h.total_size, None, h.base_offset)
                pos = seg.append(mv[h.position:h.position + h.total_size], h.base_offset,
                                 h.last_offset, h.max_timestamp, None)
                self.log_end_offset = h.last_offset + 1
                if first is None:
                    first = h.base_offset
                result = AppendResult(first, h.last_offset, h.max_timestamp, pos)
        finally:
            mv.release()
        return result

    def _segment_for_append(self, size: int, now: int | None, base_offset: int | None = None) -> Segment:
        if not self._segments:
            seg = self._create_files()
        else:
            seg = self._segments[-1]
            if seg.size and (not seg.can_fit(size) or seg.size + size > self.config.segment_bytes
                             or self._segment_too_old(seg, now)):
                seg = self._roll(base_offset if base_offset is not None else self.log_end_offset, now)
        if not seg.can_fit(size):
            # a single batch larger than segment.bytes: give it a bigger mapping
            seg.seal()
            seg.activate(seg.size + size)
        return seg

    def _segment_too_old(self, seg: Segment, now: int | None) -> bool:
        # Kafka rolls by the first batch's timestamp; a producer sending old
        # timestamps would then roll a segment per batch, so canopy rolls by the
        # segment's creation time (kept in its index header across restarts).
        roll_ms = self.config.roll_ms
        if roll_ms < 0:
            return False
        if now is None:
            now = int(time.time() * 1000)
        return now - seg.created_ms > roll_ms

    def maybe_roll(self, now_ms: int) -> bool:
        """Roll the active segment if it is non-empty and older than segment.ms."""
        if not self._segments:
            return False
        seg = self._segments[-1]
        if seg.size and self._segment_too_old(seg, now_ms):
            self._roll(self.log_end_offset, now_ms)
            return True
        return False

    def roll(self, now: int | None = None) -> Segment:
        """Force a new active segment (no-op if the active one is empty)."""
        if not self._segments:
            return self._create_files()
        if self._segments[-1].size == 0:
            return self._segments[-1]
        return self._roll(self.log_end_offset, now)

    def _roll(self, base_offset: int, now: int | None) -> Segment:
        old = self._segments[-1]
        new = Segment.create(self.directory, base_offset,
                             now if now is not None else int(time.time() * 1000))
        new.activate(self.config.segment_bytes)
        # seal() trims the old file while a flush thread might be fsyncing it: harmless.
        old.seal()
        with self._lock:
            self._segments.append(new)
            self._bases.append(base_offset)
        if self.on_roll is not None:
            self.on_roll(base_offset)
        return new

    # -- reads --------------------------------------------------------------

    def _check_range(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)

    def _segment_index(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    def read(self, fetch_offset: int, max_bytes: int, upper_offset: int | None = None,
             *, min_one_batch: bool = True) -> ReadResult:
        """Whole batches starting with the one containing ``fetch_offset``.

        Kafka Fetch rules: the first batch is returned whole even when larger
        than ``max_bytes`` (else a consumer could never make progress; pass
        ``min_one_batch=False`` for partitions after the response's first),
        later batches stop before exceeding ``max_bytes``; batches starting at
        or beyond ``upper_offset`` (the high watermark) are withheld.
        """
        if self.offline:
            raise LogOffline(self.offline)
        self._check_range(fetch_offset)
        upper = self.log_end_offset if upper_offset is None else min(upper_offset, self.log_end_offset)
        regions: list = []
        pinned: list = []
        if fetch_offset >= upper:
            return ReadResult(None, _EMPTY_SEGMENTS, regions)
        budget = max_bytes
        segs = self._segments
        i = self._segment_index(fetch_offset)
        while i < len(segs):
            seg = segs[i]
            i += 1
            start = seg.find_offset(fetch_offset)
            if start >= seg.entries:
                continue  # fetch_offset falls in a gap after this segment's data
            stop = seg.entries if upper >= seg.next_offset else seg.find_base_below(upper, start)
            if stop <= start:
                break
            pos0 = seg._entry_pos(start)
            if not regions and min_one_batch:
                # the first batch goes out whole, whatever its size
                first_end = seg._entry_end(start)
                stop = seg.find_end_within(max(pos0 + budget, first_end), start + 1, stop)
            else:
                stop = seg.find_end_within(pos0 + budget, start, stop)
            if stop <= start:
                break
            size = seg._entry_end(stop - 1) - pos0
            regions.append((seg.log_fd, pos0, size))
            pinned.append(seg)
            budget -= size
            if budget <= 0 or stop < seg.entries:
                break
            fetch_offset = seg.next_offset
        if not regions:
            return ReadResult(None, _EMPTY_SEGMENTS, regions)
        self._pin(pinned)
        return ReadResult(self, pinned, regions)

    def _pin(self, segments) -> None:
        with self._lock:
            for s in segments:
                s.pins += 1

    def _unpin(self, segments) -> None:
        with self._lock:
            for s in segments:
                s.pins -= 1
                if s.pins == 0 and s.deleted:
                    s.close()

    # -- timestamps ---------------------------------------------------------

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ts_ms at or
        after the log start offset, exact to the record (ListOffsets with a
        timestamp).  Bisects the running-max index to the batch, then decodes
        only that batch.  None when no record qualifies."""
        for seg in self._segments:
            if seg.max_timestamp < ts_ms or seg.next_offset <= self.log_start_offset:
                continue
            i = seg.find_timestamp(ts_ms)
            while i < seg.entries:
                base, last, _, pos, size = seg.entry(i)
                i += 1
                if last < self.log_start_offset:
                    continue
                for rec in iter_records(seg.read_at(pos, size)):
                    if rec.timestamp >= ts_ms and rec.offset >= self.log_start_offset:
                        return rec.offset, rec.timestamp
                # only reachable when the qualifying records lie below the log
                # start offset: keep looking in the following batches
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record carrying the log's largest
        timestamp (ListOffsets -3, KIP-734; Kafka returns the record's own
        offset, not its batch's).  None for an empty log."""
        best = None
        for seg in self._segments:
            if seg.entries and seg.next_offset > self.log_start_offset and \
                    (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None or best.max_timestamp < 0:
            return None if best is None else self._first_offset_at_or_after(best)
        i = best.find_timestamp(best.max_timestamp)
        base, last, _, pos, size = best.entry(i)
        for rec in iter_records(best.read_at(pos, size)):
            if rec.timestamp == best.max_timestamp:
                return rec.offset, rec.timestamp
        return last, best.max_timestamp

    def max_timestamp_through(self, offset: int) -> int:
        """The largest record timestamp at or below ``offset``'s batch, from the index
        alone (its running max): how recent a replica whose log ends after that batch is,
        for time lag on the status page and in /metrics. -1 when there is none."""
        best = -1
        for seg in self._segments:
            if seg.base_offset > offset or not seg.entries:
                break
            i = seg.find_offset(offset)
            if i >= seg.entries:
                best = max(best, seg.max_timestamp)
                continue
            if seg.entry(i)[0] <= offset:
                best = max(best, seg.entry(i)[2])
            elif i > 0:
                best = max(best, seg.entry(i - 1)[2])
            break
        return best

    def _first_offset_at_or_after(self, seg: Segment):
        return max(seg.base_offset, self.log_start_offset), -1

    # -- headers ------------------------------------------------------------

    def iter_batch_headers(self, from_offset: int | None = None, segments: list | None = None) -> Iterator[BatchHeader]:
        """Batch headers in offset order, read in large chunks without decoding
        records (replaying idempotent-producer state after its snapshot).  ``position``
        of each header is its file position within its segment.  ``segments``: walk
        these (pinned by the caller: a worker thread's replay) instead of the current list."""
        start_offset = self.log_start_offset if from_offset is None else from_offset
        chunk_limit = 1 << 20
        for seg in list(self._segments) if segments is None else segments:
            if seg.next_offset <= start_offset:
                continue
            i = seg.find_offset(start_offset)
            n = seg.entries
            while i < n:
                # gather consecutive batches into one pread of ~1 MiB
                pos0 = seg._entry_pos(i)
                j = seg.find_end_within(pos0 + chunk_limit, i + 1, n)
                end = seg._entry_end(j - 1)
                if end - pos0 > _HEADER_READ_SPAN * (j - i):
                    # Large batches: read each 61-byte header on its own rather than every
                    # record byte (a cold restart would read the whole tail from disk).
                    for k in range(i, j):
                        p = seg._entry_pos(k)
                        yield _make_header((*HEADER_STRUCT.unpack(seg.read_at(p, HEADER_STRUCT.size)), p))
                    i = j
                    continue
                buf = seg.read_at(pos0, end - pos0)
                for k in range(i, j):
                    p = seg._entry_pos(k)
                    yield _make_header((*HEADER_STRUCT.unpack_from(buf, p - pos0), p))
                i = j

    # -- truncation, retention, DeleteRecords ---------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: advance the log start offset to ``offset`` (persisted
        in the checkpoint file), delete whole segments entirely below it.
        ``offset`` must not exceed the log end offset (the broker checks the HW)."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self._write_checkpoint(offset)
        self._delete_segments_below(self.log_start_offset)
        return self.log_start_offset

    def _delete_segments_below(self, offset: int) -> int:
        n = 0
        while len(self._segments) > 1 and self._segments[0].next_offset <= offset \
                and self._segments[1].base_offset <= offset:
            self._remove_segment(0)
            n += 1
        return n

    def _remove_segment(self, i: int) -> None:
        with self._lock:
            seg = self._segments.pop(i)
            self._bases.pop(i)
            seg.deleted = True
            seg.unlink()
            if seg.pins == 0:
                seg.close()

    def enforce_retention(self, now_ms: int) -> int:
        """Delete whole old segments by retention.ms (the segment's largest
        timestamp is older) and retention.bytes (the log is over the limit even
        without the segment).  The active segment is never deleted.  Advances
        the log start offset; returns the number of segments deleted."""
        cfg = self.config
        deleted = 0
        total = self.size_bytes
        while len(self._segments) > 1 and cfg.delete:
            seg = self._segments[0]
            expired = False
            if cfg.retention_ms >= 0:
                newest = seg.max_timestamp
                if newest < 0:  # no timestamps: Kafka falls back to the file mtime
                    try:
                        newest = int(os.stat(seg.log_path).st_mtime * 1000)
                    except OSError:
                        newest = now_ms
                expired = now_ms - newest > cfg.retention_ms
            oversize = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
            if not (expired or oversize):
                break
            total -= seg.size
            self._remove_segment(0)
            deleted += 1
        if deleted:
            first = self._segments[0].base_offset
            if first > self.log_start_offset:
                self.log_start_offset = first
                self._write_checkpoint(first)
        self.maybe_roll(now_ms)
        return deleted

    def truncate_to(self, offset: int) -> None:
        """Replication: drop every batch containing offsets >= ``offset``.

        Truncation points are batch boundaries in Kafka; if ``offset`` falls
        inside a batch the whole batch goes and the log end offset becomes its
        base offset.  Below the log start offset the log restarts empty at
        ``offset`` (Kafka's truncateFullyAndStartAt).
        """
        if offset >= self.log_end_offset:
            return
        self._forget_cleaner_progress()
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            self._remove_segment(len(self._segments) - 1)
        seg = self._segments[-1]
        keep = seg.find_offset(offset)
        if keep < seg.entries:
            base = seg._entry_base(keep)
            if base < offset:
                offset = base
        if not seg.active:
            seg.activate(self.config.segment_bytes)
        seg.truncate_entries(keep)
        with self._lock:
            self.truncations += 1
            self.log_end_offset = seg.next_offset if seg.entries else max(seg.base_offset, offset)
            self.flushed_offset = min(self.flushed_offset, self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything; the log restarts empty at ``offset``."""
        self._forget_cleaner_progress()
        while self._segments:
            self._remove_segment(len(self._segments) - 1)
        self._ensure_directory()
        new = Segment.create(self.directory, offset, int(time.time() * 1000))
        new.activate(self.config.segment_bytes)
        with self._lock:
            self._segments.append(new)
            self._bases.append(offset)
        with self._lock:
            self.truncations += 1
            self.log_start_offset = self.log_end_offset = offset
            self.flushed_offset = offset
        self._write_checkpoint(offset)

    def _forget_cleaner_progress(self) -> None:
        """A truncation may cut below where the cleaner stopped; what is appended after it
        is dirty again, so the next cleaning of a compacted log starts over (Kafka's
        cleaner manager resets its checkpoint on truncation too)."""
        try:
            (self.directory / CLEANER_CHECKPOINT).unlink()
        except FileNotFoundError:
            pass

    # -- durability -----------------------------------------------------------

    def flush(self) -> int:
        """fsync everything appended before this call started; return the log
        end offset it covers (also left in ``flushed_offset``).

        Order per segment: .log data, then flushed_length into the index header,
        then the .index file (entries + committed/flushed lengths); new segment
        files also get their directory entry fsynced.  Safe from a worker thread
        while the owning thread appends; concurrent flushes are serialised, so
        a caller waiting for offset X may rely on any flush that returns >= X.
        """
        with self._flush_lock:
            target = self.log_end_offset
            truncations = self.truncations
            if self.offline:
                raise LogOffline(self.offline)
            with self._lock:
                if self._closed:
                    return self.flushed_offset
                work = [(s, s.size) for s in self._segments
                        if s.size > s.flushed_length or s.needs_dir_sync]
                for s, _ in work:
                    s.pins += 1
            try:
                if self._checkpoint_unsynced:
                    self._sync_checkpoint()
                if any(s.needs_dir_sync for s, _ in work):
                    for s, _ in work:
                        s.needs_dir_sync = False
                    self._fsync_dir()
                if self._parent_unsynced:
                    # the partition directory's own entry (made at its first append)
                    self._parent_unsynced = False
                    fsync_path(self.directory.parent)
                for s, committed in work:
                    if not s.deleted:
                        s.flush_to(committed)
            except OSError as e:
                if self._closed:
                    raise   # closed by DeleteTopics meanwhile: not a disk fault
                # Never retry a failed fsync and report success: the kernel may already
                # have dropped the pages it could not write ("fsyncgate").
                self.offline = f"fsync of {self.directory} failed: {e.strerror or e}"
                raise LogOffline(self.offline) from e
            finally:
                self._unpin([s for s, _ in work])
            # A truncation while this flush ran lowered flushed_offset; raising it again
            # would claim offsets that were cut (and maybe rewritten) as durable.
            with self._lock:
                if truncations != self.truncations:
                    return self.flushed_offset
                if target > self.flushed_offset:
                    self.flushed_offset = target
            return target

    def close(self, flush: bool = True) -> None:
        """Flush (unless ``flush=False``: the log is about to be deleted), trim the active
        segment's preallocated tail, close files."""
        if self._closed:
            return
        if flush and not self.offline:
            try:
                self.flush()
            except LogOffline:
                pass   # logged where it happened; recovery re-checks the tail on start
        with self._lock:
            self._closed = True
            for seg in self._segments:
                seg.seal()
                if seg.pins == 0:
                    seg.close()
                else:
                    seg.deleted = True  # closed by the last unpin

    def delete(self) -> None:
        """DeleteTopics: close and remove the partition directory."""
        with self._lock:
            self._closed = True
            segs, self._segments, self._bases = self._segments, [], []
            for seg in segs:
                seg.deleted = True
                if seg.pins == 0:
                    seg.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return (f"Log({str(self.directory)!r}, log_start_offset={self.log_start_offset}, "
                f"log_end_offset={self.log_end_offset}, segments={len(self._segments)})")
