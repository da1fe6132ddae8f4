"""Log compaction (Kafka's log cleaner) for topics whose cleanup.policy includes compact.

One cleaning of a partition, in Kafka's steps:

1. ``plan`` (the log's owning thread): the cleanable range is every sealed segment from
   the start of the log up to the first one holding a record newer than
   ``min.compaction.lag.ms`` (the active segment is never cleaned).  The part from the
   *first dirty offset* (where the previous cleaning stopped, kept in
   ``cleaner-offset.checkpoint``) on is dirty; the partition is cleaned when
   dirty / cleanable bytes >= ``min.cleanable.dirty.ratio``, or a dirty segment's first
   batch is older than ``max.compaction.lag.ms``, or a kept tombstone's
   ``delete.retention.ms`` has run out.  The segments are pinned (their files stay open)
   until ``release``.
2. ``build_offset_map`` (worker thread): key -> offset of its latest record in the
   dirty part.
3. ``clean_group`` (worker thread), per group of consecutive segments that fit in one
   ``segment.bytes`` (see clean_group): every batch is copied to
   ``<base>.log.cleaned`` keeping only the records that are the latest for their key
   (original offsets: a kept batch keeps its baseOffset, lastOffsetDelta and
   firstTimestamp, so the records' offset and timestamp deltas are copied verbatim;
   maxTimestamp is recomputed and the CRC redone), dropping tombstones once the delete
   horizon their first cleaning stamped on the batch has passed (see ``_retained``).  A batch left without records disappears, except
   the last batch of an idempotent producer, kept empty as Kafka keeps it, so the
   producer's next sequence number still follows on after a restart rebuilds the
   producer state from the log.  The index is rebuilt for the batches written
   (``<base>.index.cleaned``: running max timestamps of what is left, so timestamp
   lookups stay exact) and both files are fsynced.
4. ``swap_in`` (owning thread): the crash-safe replacement, Kafka's .cleaned/.swap
   dance.  ``.index.cleaned`` -> ``.index.swap``, then ``.log.cleaned`` -> ``.log.swap``:
   that rename is the commit point.  Then the group's other segments are unlinked and
   the ``.swap`` files renamed over ``<base>.index`` / ``<base>.log``.  Recovery on open
   (``complete_interrupted_swaps``) deletes ``.cleaned`` files (the old segments are
   intact) and redoes the second half for every ``.log.swap`` (the new segment is
   complete and durable), so a kill -9 anywhere leaves the old segments or the new one.
   The range a swap replaces is the index header's ``sparse_end`` field.  Readers
   holding an old segment (a Fetch in flight) keep its file descriptors: the unlinked
   inode lives until they are done.
5. ``finish`` (worker thread): fsync the directory, write the checkpoint.

All I/O is throttled by one ``Throttler`` (``log.cleaner.io.max.bytes.per.second``).
Clocks are passed in; nothing here imports Trio.
"""
from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from protocol.records import (
    DELETE_HORIZON_MASK, HEADER_STRUCT, LOG_APPEND_TIME, NO_TIMESTAMP, BatchHeader,
    batch_records_section, rebase_record_timestamp, rebuild_batch, record_spans,
)

from .files import replace_durably
from .segment import (
    BOOT_ID, ENTRY, INDEX_HEADER, INDEX_HEADER_SIZE, INDEX_MAGIC, Segment, _Q, _SPARSE_AT,
    segment_name,
)

log = logging.getLogger("canopy.cleaner")

CLEANER_CHECKPOINT = "cleaner-offset.checkpoint"
# Kafka sizes its offset map by log.cleaner.dedupe.buffer.size (128 MiB, 24 bytes a key);
# a Python dict entry costs ~100-200 bytes, so fewer keys per cleaning.
MAX_MAP_ENTRIES = 2_000_000
_NO_DUE = -1
_HEADER_SIZE = HEADER_STRUCT.size


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- checkpoint -----------------------------------------------------------------------

def read_checkpoint(directory: Path) -> tuple[int, int]:
    """(first dirty offset, earliest time a kept tombstone may go or -1)."""
    try:
        parts = (Path(directory) / CLEANER_CHECKPOINT).read_text().split()
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else _NO_DUE
    except (FileNotFoundError, ValueError, IndexError):
        return 0, _NO_DUE


def write_checkpoint(directory: Path, first_dirty: int, tombstone_due: int) -> None:
    replace_durably(Path(directory) / CLEANER_CHECKPOINT, f"{first_dirty} {tombstone_due}\n")


# -- throttling -----------------------------------------------------------------------

class Throttler:
    """Limits the cleaner's reads plus writes to ``bytes_per_second`` (Kafka's
    log.cleaner.io.max.bytes.per.second) by sleeping the cleaning thread.  Shared by
    every cleaning of a broker; ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(self, bytes_per_second: float, clock=time.monotonic, sleep=time.sleep):
        self.rate = float(bytes_per_second)
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._start = clock()
        self._bytes = 0
        self.slept = 0.0

    def charge(self, nbytes: int, stop: threading.Event | None = None) -> None:
        """Account ``nbytes`` of I/O; sleep as long as the rate requires (cut short
        when ``stop`` is set: the broker is shutting down)."""
        if self.rate <= 0 or self.rate == float("inf"):
            return
        with self._lock:
            now = self.clock()
            elapsed = now - self._start
            if elapsed > 1.0 and self._bytes <= self.rate * elapsed:
                # a fresh window after an idle spell: no burst credit carried over
                self._start, self._bytes, elapsed = now, 0, 0.0
            self._bytes += nbytes
            wait = self._bytes / self.rate - elapsed
        if wait > 0:
            if stop is not None and self.sleep is time.sleep:
                stop.wait(wait)
            else:
                self.sleep(wait)
            self.slept += wait


UNLIMITED = Throttler(float("inf"))


class CleaningAborted(Exception):
    """The plan's ``stop`` was set (shutdown): the cleaning gives up; its .cleaned files
    are removed now or by the next start's recovery."""


# -- planning -------------------------------------------------------------------------

@dataclass
class CleaningPlan:
    log: object                       # storage.log.Log
    now_ms: int
    segments: list                    # cleanable segments, oldest first (pinned)
    tail: list                        # the rest of the log, active included (pinned)
    first_dirty: int
    end_offset: int                   # first offset not cleaned (the next segment's base)
    dirty_bytes: int
    cleanable_bytes: int
    reason: str
    truncations: int
    producer_last_offsets: dict | None = None   # producer id -> last offset of its last batch
    offset_map: dict = field(default_factory=dict)
    tombstone_due: int = _NO_DUE
    bytes_read: int = 0
    bytes_written: int = 0
    released: bool = False
    pid_last_in_range: dict | None = None
    latest_offsets: list | None = None          # sorted offsets of the map (for bisection)
    stop: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> str:
        secs = max(time.monotonic() - self.started, 1e-6)
        return (f"{self.reason}; read {self.bytes_read / 1e6:.1f} MB, wrote {self.bytes_written / 1e6:.1f} MB "
                f"in {secs:.2f} s ({self.bytes_read / 1e6 / secs:.1f} MB/s cleaned)")

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.cleanable_bytes if self.cleanable_bytes else 0.0

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.log._unpin(self.segments + self.tail)


def dirty_stats(log_, now_ms: int) -> tuple[list, int, int, int, bool, int]:
    """(cleanable segments, first dirty offset, dirty bytes, cleanable bytes,
    max.compaction.lag.ms exceeded, tombstone due time)."""
    cfg = log_.config
    segs = log_.segments[:-1]         # never the active segment
    first_dirty, tombstone_due = read_checkpoint(log_.directory)
    first_dirty = max(first_dirty, log_.log_start_offset)
    cleanable = []
    for seg in segs:
        if cfg.min_compaction_lag_ms > 0 and seg.max_timestamp > now_ms - cfg.min_compaction_lag_ms:
            break   # this and later segments hold records too young to compact
        cleanable.append(seg)
    dirty = total = 0
    overdue = False
    for seg in cleanable:
        total += seg.size
        if seg.base_offset >= first_dirty or seg.next_offset > first_dirty:
            dirty += seg.size
            if seg.entries and now_ms - seg.entry(0)[2] > cfg.max_compaction_lag_ms:
                overdue = True
    return cleanable, first_dirty, dirty, total, overdue, tombstone_due


def plan(log_, now_ms: int, producer_last_offsets: dict | None = None) -> CleaningPlan | None:
    """Decide whether ``log_`` needs cleaning now (owning thread); None if not."""
    cfg = log_.config
    if not cfg.compact or log_.offline or getattr(log_, "_closed", False):
        return None
    cleanable, first_dirty, dirty, total, overdue, due = dirty_stats(log_, now_ms)
    if not cleanable:
        return None
    ratio = dirty / total if total else 0.0
    if dirty and ratio >= cfg.min_cleanable_dirty_ratio:
        reason = f"dirty ratio {ratio:.2f}"
    elif dirty and overdue:
        reason = "max.compaction.lag.ms"
    elif due != _NO_DUE and now_ms >= due:
        reason = "delete.retention.ms of a tombstone"
    else:
        return None
    all_segs = log_.segments
    tail = all_segs[len(cleanable):]
    end_offset = tail[0].base_offset
    log_._pin(cleanable + tail)
    return CleaningPlan(log_, now_ms, cleanable, tail, first_dirty, end_offset, dirty, total,
                        reason, log_.truncations, producer_last_offsets)


# -- reading batches (worker thread) --------------------------------------------------------

def _iter_batches(seg: Segment, throttler: Throttler, plan_: CleaningPlan, chunk: int = 1 << 20):
    """(header, batch bytes) of every batch of a sealed, pinned segment."""
    n = seg.entries
    i = 0
    while i < n:
        if plan_.stop.is_set():
            raise CleaningAborted(str(plan_.log.directory))
        pos0 = seg._entry_pos(i)
        j = seg.find_end_within(pos0 + chunk, i + 1, n)
        end = seg._entry_end(j - 1)
        buf = seg.read_at(pos0, end - pos0)
        throttler.charge(len(buf), plan_.stop)
        plan_.bytes_read += len(buf)
        for k in range(i, j):
            p = seg._entry_pos(k) - pos0
            size = seg._entry_size(k)
            h = BatchHeader._make((*HEADER_STRUCT.unpack_from(buf, p), 0))
            yield h, memoryview(buf)[p:p + size]
        i = j


def build_offset_map(plan_: CleaningPlan, throttler: Throttler = UNLIMITED,
                     max_entries: int = MAX_MAP_ENTRIES) -> dict:
    """key -> offset of its latest record in the dirty segments.  When the map fills up
    the cleaning stops at the end of the segment that filled it (Kafka's cleaner does
    the same with its dedupe buffer); the rest waits for the next round."""
    m = plan_.offset_map
    for idx, seg in enumerate(plan_.segments):
        if not (seg.base_offset >= plan_.first_dirty or seg.next_offset > plan_.first_dirty):
            continue
        if len(m) >= max_entries:
            # drop the segments past the map's reach from this cleaning
            rest = plan_.segments[idx:]
            plan_.segments = plan_.segments[:idx]
            plan_.tail = rest + plan_.tail
            plan_.end_offset = rest[0].base_offset
            break
        for h, batch in _iter_batches(seg, throttler, plan_):
            if h.is_control or h.records_count == 0:
                continue
            hh, body = batch_records_section(batch)
            base = h.base_offset
            for offset_delta, _, key, _, _, _ in record_spans(hh, body):
                if key is not None:
                    m[key] = base + offset_delta
    plan_.latest_offsets = sorted(m.values())
    return m


def _later_producer_batches(plan_: CleaningPlan, throttler: Throttler) -> dict:
    """producer id -> last offset of its newest batch in the tail (the segments after
    the cleaned range), from the broker's producer state when given, else read from
    the tail's batch headers."""
    if plan_.producer_last_offsets is not None:
        return plan_.producer_last_offsets
    out = {}
    for seg in plan_.tail:
        for i in range(seg.entries):
            pos, size = seg._entry_pos(i), seg._entry_size(i)
            h = BatchHeader._make((*HEADER_STRUCT.unpack_from(seg.read_at(pos, _HEADER_SIZE)), pos))
            if h.producer_id >= 0:
                out[h.producer_id] = max(out.get(h.producer_id, -1), h.last_offset)
    return out


# -- cleaning one group (worker thread) -------------------------------------------------

@dataclass
class CleanedGroup:
    directory: Path
    old: list                # the segments replaced (pinned by the plan)
    base_offset: int
    end_offset: int          # first offset after the range replaced
    batches: int
    records_kept: int
    records_dropped: int
    size: int

    @property
    def log_path(self) -> Path:
        return self.directory / (segment_name(self.base_offset) + ".log")

    @property
    def index_path(self) -> Path:
        return self.directory / (segment_name(self.base_offset) + ".index")

    def discard(self) -> None:
        for p in (self.log_path, self.index_path):
            for suffix in (".cleaned", ".swap"):
                try:
                    Path(str(p) + suffix).unlink()
                except FileNotFoundError:
                    pass


def _retained(plan_: CleaningPlan, h: BatchHeader, batch, later: dict, pid_last_in_range: dict,
              stats: list) -> bytes | None:
    """The batch as it is kept (the original bytes when nothing changes), or None.

    Tombstones follow KIP-534: the first cleaning that keeps a batch holding tombstones
    stamps it with a delete horizon, now + delete.retention.ms (attribute bit 6, the
    horizon in firstTimestamp, every record's timestamp delta rebased so its timestamp
    is unchanged); a later cleaning after the horizon drops them.  A consumer that
    starts reading the log before a tombstone's first cleaning therefore has at least
    delete.retention.ms to reach it."""
    if h.is_control:
        return bytes(batch)
    cfg = plan_.log.config
    m = plan_.offset_map
    if h.base_offset >= plan_.first_dirty and plan_.latest_offsets is not None:
        # Every key of a dirty batch is in the map: when no latest offset falls inside
        # the batch, all of its records go, and its records need not be decoded (the
        # common case in a log of frequent updates).
        lo = bisect.bisect_left(plan_.latest_offsets, h.base_offset)
        if lo == len(plan_.latest_offsets) or plan_.latest_offsets[lo] > h.last_offset:
            stats[1] += h.records_count
            return _emptied(h, later, pid_last_in_range)
    hh, body = batch_records_section(batch)
    spans = record_spans(hh, body)
    keep = []
    horizon = h.base_timestamp if h.attributes & DELETE_HORIZON_MASK else None
    base = h.base_offset
    tombstones = 0
    for r in spans:
        offset_delta, _, key, tombstone, _, _ = r
        if key is None:
            continue   # Kafka's cleaner drops keyless records (written before the policy changed)
        latest = m.get(key)
        if latest is not None and base + offset_delta < latest:
            continue
        if tombstone:
            if horizon is not None and plan_.now_ms >= horizon:
                continue
            tombstones += 1
        keep.append(r)
    stats[0] += len(keep)
    stats[1] += len(spans) - len(keep)
    new_horizon = None
    if tombstones:
        if horizon is None and h.base_timestamp != NO_TIMESTAMP:
            new_horizon = horizon = plan_.now_ms + cfg.delete_retention_ms
        elif horizon is None:
            horizon = plan_.now_ms + cfg.delete_retention_ms   # no timestamps to rebase
        if plan_.tombstone_due == _NO_DUE or horizon < plan_.tombstone_due:
            plan_.tombstone_due = horizon
    if len(keep) == len(spans) and new_horizon is None:
        return bytes(batch)
    if not keep:
        return _emptied(h, later, pid_last_in_range)
    if h.timestamp_type == LOG_APPEND_TIME:
        max_ts = h.max_timestamp
    else:
        max_ts = h.base_timestamp + max(r[1] for r in keep)
    if new_horizon is not None:
        shift = new_horizon - h.base_timestamp
        section = b"".join(rebase_record_timestamp(body, r, shift) for r in keep)
        return rebuild_batch(h, section, len(keep), max_ts, base_timestamp=new_horizon,
                             attributes=h.attributes | DELETE_HORIZON_MASK)
    section = b"".join(bytes(body[r[4]:r[5]]) for r in keep)
    return rebuild_batch(h, section, len(keep), max_ts)


def _emptied(h: BatchHeader, later: dict, pid_last_in_range: dict) -> bytes | None:
    """A batch all of whose records go: dropped, unless it is its idempotent producer's
    last batch, kept empty (offsets, sequence range and producer epoch intact) so the
    producer state rebuilt from the log still continues from it."""
    if h.producer_id >= 0 and pid_last_in_range.get(h.producer_id) == h.last_offset \
            and later.get(h.producer_id, -1) <= h.last_offset:
        return rebuild_batch(h, b"", 0, h.max_timestamp)
    return None


def clean_group(plan_: CleaningPlan, first: int, throttler: Throttler = UNLIMITED) -> CleanedGroup:
    """Clean the plan's segments from index ``first`` into one new segment,
    ``<base>.log.cleaned`` / ``.index.cleaned``, fsynced (worker thread).  Nothing the
    log uses is touched.  Segments join the group while what was written so far plus
    the next segment's original size fits in segment.bytes (Kafka groups by original
    sizes alone; counting the cleaned size lets a log whose old segments clean down to
    nothing collapse into one file), so ``len(result.old)`` segments were consumed."""
    directory = plan_.log.directory
    limit = plan_.log.config.segment_bytes
    group = [plan_.segments[first]]
    base = group[0].base_offset
    later = _later_producer_batches(plan_, throttler)
    if plan_.producer_last_offsets is None:
        plan_.producer_last_offsets = later   # computed once per plan
    cg = CleanedGroup(directory, [], base, -1, 0, 0, 0, 0)
    log_tmp = Path(str(cg.log_path) + ".cleaned")
    ix_tmp = Path(str(cg.index_path) + ".cleaned")
    entries = bytearray()
    running_max = -1
    stats = [0, 0]
    pid_last_in_range = _producer_last_in_range(plan_, throttler)
    fd = os.open(log_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        pending = []
        pending_size = 0
        k = first
        while True:
            seg = plan_.segments[k]
            for h, batch in _iter_batches(seg, throttler, plan_):
                out = _retained(plan_, h, batch, later, pid_last_in_range, stats)
                if out is None:
                    continue
                max_ts = HEADER_STRUCT.unpack_from(out, 0)[8]
                running_max = max(running_max, max_ts)
                entries += ENTRY.pack(h.base_offset, h.last_offset, running_max, pos, len(out))
                pos += len(out)
                pending.append(out)
                pending_size += len(out)
                cg.batches += 1
                if pending_size >= 1 << 20:
                    _write_all(fd, b"".join(pending))
                    throttler.charge(pending_size, plan_.stop)
                    plan_.bytes_written += pending_size
                    pending, pending_size = [], 0
            k += 1
            if k >= len(plan_.segments) or pos + plan_.segments[k].size > limit:
                break
            group.append(plan_.segments[k])
        end = plan_.segments[k].base_offset if k < len(plan_.segments) else plan_.end_offset
        cg.old, cg.end_offset = list(group), end
        if pending:
            _write_all(fd, b"".join(pending))
            throttler.charge(pending_size, plan_.stop)
            plan_.bytes_written += pending_size
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        cg.discard()
        raise
    os.close(fd)
    cg.size = pos
    cg.records_kept, cg.records_dropped = stats
    header = bytearray(INDEX_HEADER.pack(INDEX_MAGIC, pos, pos, group[0].created_ms, base,
                                         BOOT_ID).ljust(INDEX_HEADER_SIZE, b"\0"))
    _Q.pack_into(header, _SPARSE_AT, end)
    fd = os.open(ix_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, bytes(header) + bytes(entries))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        cg.discard()
        raise
    os.close(fd)
    return cg


def _producer_last_in_range(plan_: CleaningPlan, throttler: Throttler) -> dict:
    """producer id -> last offset of its newest batch within the cleaned range."""
    if plan_.pid_last_in_range is not None:
        return plan_.pid_last_in_range
    out: dict = {}
    for seg in plan_.segments:
        for i in range(seg.entries):
            pos = seg._entry_pos(i)
            hdr = seg.read_at(pos, _HEADER_SIZE)
            h = BatchHeader._make((*HEADER_STRUCT.unpack_from(hdr), pos))
            if h.producer_id >= 0:
                out[h.producer_id] = h.last_offset
    plan_.pid_last_in_range = out
    return out


def _write_all(fd: int, data: bytes) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]


# -- swapping in (owning thread) and recovery ---------------------------------------------

def swap_in(plan_: CleaningPlan, cg: CleanedGroup) -> bool:
    """Replace the group's segments by the cleaned one (owning thread).  False, with the
    cleaned files removed, when the log changed underneath (truncation, retention,
    deletion): the next round starts over."""
    lg = plan_.log
    segs = lg._segments
    try:
        i = next(k for k, s in enumerate(segs) if s is cg.old[0])
    except StopIteration:
        i = -1
    if lg._closed or lg.offline or lg.truncations != plan_.truncations or i < 0 \
            or segs[i:i + len(cg.old)] != cg.old or any(s.deleted for s in cg.old) \
            or i + len(cg.old) >= len(segs):
        cg.discard()
        return False
    d = lg.directory
    os.rename(str(cg.index_path) + ".cleaned", str(cg.index_path) + ".swap")
    os.rename(str(cg.log_path) + ".cleaned", str(cg.log_path) + ".swap")   # the commit point
    _finish_swap(d, cg.base_offset, cg.end_offset)
    new, _ = Segment.open(d, cg.base_offset)
    with lg._lock:
        lg._segments[i:i + len(cg.old)] = [new]
        lg._bases[i:i + len(cg.old)] = [new.base_offset]
        for s in cg.old:
            s.deleted = True      # files already gone; fds close at the last unpin
            if s.pins == 0:
                s.close()
    return True


def _finish_swap(directory: Path, base: int, end: int) -> None:
    """Second half of a swap, idempotent: delete the replaced segments other than the
    first, then rename the .swap files over the first one's names."""
    for p in list(directory.iterdir()):
        name = p.name
        if name.endswith(".log") and name[:-4].isdigit():
            b = int(name[:-4])
            if base < b < end:
                try:
                    (directory / (name[:-4] + ".index")).unlink()
                except FileNotFoundError:
                    pass
                p.unlink()
    stem = directory / segment_name(base)
    ix_swap = Path(str(stem) + ".index.swap")
    if ix_swap.exists():
        os.rename(ix_swap, str(stem) + ".index")
    os.rename(str(stem) + ".log.swap", str(stem) + ".log")


def complete_interrupted_swaps(directory: Path) -> int:
    """On open: finish every committed swap (a ``.log.swap`` exists), drop every
    uncommitted one (``.cleaned`` files, an ``.index.swap`` without its ``.log.swap``).
    Returns the number of swaps finished."""
    directory = Path(directory)
    done = 0
    names = {p.name for p in directory.iterdir()}
    for name in sorted(names):
        if name.endswith(".cleaned"):
            (directory / name).unlink()
    for name in sorted(names):
        if name.endswith(".log.swap") and name[:-9].isdigit():
            base = int(name[:-9])
            stem = directory / name[:-9]
            ix = Path(str(stem) + ".index.swap")
            if not ix.exists():
                ix = Path(str(stem) + ".index")   # renamed already
            try:
                with open(ix, "rb") as f:
                    hdr = f.read(INDEX_HEADER_SIZE)
                end = _Q.unpack_from(hdr, _SPARSE_AT)[0]
            except (OSError, struct.error):
                end = 0
            if end <= base:
                # the index was fsynced before the commit; if it is unreadable anyway,
                # replace only the first segment (the others are kept: duplicates are
                # dropped by the log's overlap check, not data lost)
                end = base + 1
            _finish_swap(directory, base, end)
            log.info("%s: finished an interrupted compaction swap of [%d, %d)", directory, base, end)
            done += 1
    for name in sorted(names):
        if name.endswith(".index.swap") and not (directory / (name[:-11] + ".log.swap")).exists() \
                and name[:-11] + ".log.swap" not in names:
            try:
                (directory / name).unlink()
            except FileNotFoundError:
                pass
    if done:
        _fsync_path(directory, directory=True)
    return done


def finish(plan_: CleaningPlan) -> None:
    """After the swaps (worker thread): make the renames durable and remember where the
    next cleaning's dirty part starts."""
    lg = plan_.log
    if getattr(lg, "_closed", False):
        return
    try:
        _fsync_path(lg.directory, directory=True)
        write_checkpoint(lg.directory, plan_.end_offset, plan_.tombstone_due)
    except FileNotFoundError:
        pass   # the partition was deleted meanwhile


def clean_log(log_, now_ms: int, throttler: Throttler = UNLIMITED,
              producer_last_offsets: dict | None = None, max_map_entries: int = MAX_MAP_ENTRIES,
              ) -> CleaningPlan | None:
    """One whole cleaning in the calling thread (tests, tools); the broker runs the
    steps itself to keep the slow ones off its event loop."""
    p = plan(log_, now_ms, producer_last_offsets)
    if p is None:
        return None
    try:
        build_offset_map(p, throttler, max_map_entries)
        i = 0
        while i < len(p.segments):
            cg = clean_group(p, i, throttler)
            swap_in(p, cg)
            i += len(cg.old)
        finish(p)
    finally:
        p.release()
    return p
