"""Topics and partitions on this broker: the registry every handler works through.

Layout under the data directory::

    topics/<name>/topic.json      topic id, partition count, topic-level configs
    topics/<name>/<partition>/    one storage.Log per partition

Topic names are restricted by Kafka to [a-zA-Z0-9._-] (max 249 chars), so they are safe
as directory names.
"""
from __future__ import annotations

import concurrent.futures
import functools
import heapq
import json
import logging
import os
import re
import resource
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import trio

from protocol.errors import ErrorCode
from protocol.records import iter_records, validate_batches
from replication.replica_state import EpochCache, LeaderState, truncation_point
from replication.tree import children_of, parent_of
from storage import Log, LogConfig, StorageError, fsync_path, make_files_ahead, replace_durably

from . import topic_configs as tc
from .producer_state import (
    ProducerStateTable, SnapshotError, decode_snapshot, delete_snapshots, encode_snapshot,
    list_snapshots, snapshot_path,
)

log = logging.getLogger("canopy.topics")

# Writes every partition's producer-state snapshots, one at a time in submission order,
# off the event loop (see Partition.write_snapshot).
_SNAPSHOT_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-writer")
# Makes new partitions' directories and empty segment files after CreateTopics (or
# CreatePartitions) has been answered (Log.make_files_ahead), off the event loop. Not at
# a lower priority: the sooner it is done, the fewer first appends make their files on
# the event loop (at nice 19, W4's produce phase made most of them itself).
_FILE_MAKER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="partition-files")


def _make_files_ahead(topic: "Topic", first: int) -> None:
    """On the file maker: the files of the topic's partitions from ``first`` on. A
    partition made meanwhile (its first use) is asked through its log, which skips it
    once written; one not made yet by its path, at offset 0 (where a new log starts),
    stopping should it be made meanwhile: a follower made now may start its log at its
    leader's log start instead. Create-only either way (storage.make_files_ahead)."""
    parts = topic.partitions
    for i in range(first, len(parts)):
        if topic.deleted:
            return
        if parts.is_made(i):
            parts[i].log.make_files_ahead()
        else:
            make_files_ahead(f"{topic.directory}/{i}", 0,
                             lambda i=i: not topic.deleted and not parts.is_made(i))


_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets"})

class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


def validate_topic_name(name: str | None) -> None:
    if not name:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name longer than {MAX_TOPIC_NAME}")
    if not _LEGAL_NAME.match(name):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


_hw_waiter_seq = count()


class Partition:
    """One partition's log plus the broker-side state around it: its place in the
    replication tree, the high watermark, the ISR (replication/replica_state.py holds the
    rules), idempotent-producer state and the epoch cache used by OffsetForLeaderEpoch."""

    # CreateTopics of 1 000 partitions makes 1 000 of these before it answers, so a
    # partition is cheap to make: what starts out the same for every partition is a class
    # attribute until first assigned, and what it needs only once used (producer state,
    # waiters, the leader's follower state) is a cached_property, made on first access and
    # from then on a plain instance attribute. Made eagerly, they were 3 of the ~5 µs per
    # partition that the create's answer waited for.
    fanout = 1
    # Kafka keeps the leader epoch stable until leadership changes; a moving epoch
    # makes clients call OffsetForLeaderEpoch.
    leader_epoch = 0
    # Rolls met inside a replicated append, whose batches enter the producer state
    # only after the whole append: their snapshots wait until the state reaches them.
    _replicating = False
    _snapshot_job: concurrent.futures.Future | None = None
    needs_truncation = False   # a follower must reconcile with its upstream first
    # A leadership this broker held before it (re)started: not to be exercised until
    # the controller decides again, since the log it led may be gone or behind.
    fenced = False
    # Traffic counters for /metrics (Kafka's BrokerTopicMetrics), plain ints bumped on
    # the request path and summed per topic only when scraped.
    bytes_in = messages_in = bytes_out = 0
    replication_bytes_in = replication_messages_in = replication_bytes_out = 0
    last_upstream_fetch_ms = -1   # monotonic ms of the last answered fetch from our upstream

    def __init__(self, topic: "Topic", index: int, log_: Log, node_id: int = 0, lag_time_ms: int = 30_000):
        self.topic = topic
        self.index = index
        self.log = log_
        self.node_id = node_id
        self.lag_time_ms = lag_time_ms
        # Tree order: replicas[0] is the leader (replication/tree.py). Single node: just us.
        self.replicas: list[int] = [node_id]
        # The ISR the metadata store holds (the leader proposes, the store commits).
        self.committed_isr: list[int] = [node_id]
        if log_.has_files:   # else nothing to load (a new partition)
            self._load_state()
        log_.on_roll = self._on_roll
        self._hw = self.log.log_start_offset

    @functools.cached_property
    def producers(self) -> ProducerStateTable:
        return ProducerStateTable()

    @functools.cached_property
    def epochs(self) -> EpochCache:
        return EpochCache()

    @functools.cached_property
    def _pending_snapshots(self) -> list[int]:
        return []

    @functools.cached_property
    def waiters(self) -> set[trio.Event]:
        """Long-polling fetches park an Event here; an append or a high-watermark move
        sets them all. One Event per waiting Fetch lets a Fetch wait on many partitions."""
        return set()

    @functools.cached_property
    def _hw_waiters(self) -> list[tuple[int, int, trio.Event]]:
        """acks=all Produce answers waiting for the high watermark, as a heap of (offset,
        seq, event): only the HW reaching an offset wakes its waiter (Kafka checks its
        DelayedProduce when the HW moves), not every append. Woken by notify_append, a
        producer's 16 pipelined answers each woke, looked and parked again on every
        append and every child's fetch: a sixth of the leader's Python calls at
        acks=all. A waiter that timed out leaves its entry until the HW passes it."""
        return []

    @functools.cached_property
    def leader_state(self) -> LeaderState:
        return LeaderState(self.node_id, self.lag_time_ms)

    @functools.cached_property
    def hw_sent(self) -> dict[int, int]:
        """Replica id -> high watermark last sent to it."""
        return {}

    @functools.cached_property
    def downstream_fetches(self) -> dict[int, tuple[int, int]]:
        """Replica id -> (fetch offset, monotonic ms) of its last fetch from us."""
        return {}

    # -- producer state and epoch cache: snapshots + replay (producer_state.py) ----------
    def _restore_snapshot(self) -> tuple[int, ProducerStateTable, EpochCache]:
        """The newest valid snapshot within [log start, log end] as (offset, table, epoch
        cache); snapshots beyond the log end (a truncation, or a machine crash that lost
        log data the snapshot had seen) are deleted, a damaged one is deleted with one
        line and the next older one tried. Without one: (log start, empty, empty)."""
        d = self.log.directory
        start, end = self.log.log_start_offset, self.log.log_end_offset
        epochs = EpochCache()
        if not self.log.has_files:
            return start, ProducerStateTable(), epochs   # never written: no directory yet
        delete_snapshots(d, lambda off: off <= end)
        if end > start:
            for off in reversed(list_snapshots(d)):
                if off < start:
                    break
                path = snapshot_path(d, off)
                try:
                    snap_off, table, entries = decode_snapshot(path.read_bytes())
                    if snap_off != off:
                        raise SnapshotError(f"holds offset {snap_off}")
                except (OSError, SnapshotError) as e:
                    log.warning("producer-state snapshot %s is damaged (%s): removed, trying an older one",
                                path, e)
                    path.unlink(missing_ok=True)
                    continue
                epochs.entries = [tuple(e) for e in entries]
                return off, table, epochs
        return start, ProducerStateTable(), epochs

    @staticmethod
    def _replay(headers, producers: ProducerStateTable, epochs: EpochCache) -> None:
        for h in headers:
            epochs.note(h.partition_leader_epoch, h.base_offset)
            if h.producer_id >= 0 and not h.is_control:
                producers.record(h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta,
                                 h.base_offset, h.max_timestamp)

    def _load_state(self) -> None:
        """On start (before the event loop runs): snapshot + the batch headers after it."""
        offset, producers, epochs = self._restore_snapshot()
        self._replay(self.log.iter_batch_headers(offset), producers, epochs)
        self.producers, self.epochs = producers, epochs

    async def _reload_state(self) -> None:
        """After a truncation: as _load_state, but a replay reaching below the active
        segment (no snapshot near the new end) runs in a worker thread over pinned
        segments, so the event loop keeps serving; batches appended meanwhile are
        replayed here afterwards, and a truncation meanwhile starts it over."""
        while True:
            truncations = self.log.truncations
            offset, producers, epochs = self._restore_snapshot()
            if offset < self.log.active_segment.base_offset:
                end = self.log.log_end_offset
                segs = self.log.segments
                self.log._pin(segs)
                try:
                    headers = await trio.to_thread.run_sync(
                        lambda: [h for h in self.log.iter_batch_headers(offset, segs) if h.base_offset < end])
                finally:
                    self.log._unpin(segs)
                if truncations != self.log.truncations:
                    continue
                self._replay(headers, producers, epochs)
                offset = end
            self._replay(self.log.iter_batch_headers(offset), producers, epochs)
            self.producers, self.epochs = producers, epochs
            return

    def write_snapshot(self, offset: int | None = None, *, wait: bool = False) -> None:
        """Snapshot the producer state and epoch cache as they stand, covering every batch
        below ``offset`` (default: the log end). The bytes are taken now; the durable
        write (temp file, fsync, rename, directory fsync) runs on the snapshot writer
        thread unless ``wait``: a roll happens inside a Produce, on the event loop, where
        two fsyncs would stall every connection (Kafka also flushes these asynchronously).
        Snapshots below the log start offset are dropped: a restart never needs them."""
        if offset is None:
            offset = self.log.log_end_offset
        directory = self.log.directory
        path = snapshot_path(directory, offset)
        data = encode_snapshot(offset, self.producers, self.epochs.entries)
        start = self.log.log_start_offset
        name = f"{self.topic.name}-{self.index}"

        lg = self.log

        def write() -> None:
            if (lg._closed and not wait) or not directory.exists():
                return   # the topic was deleted meanwhile (its name may be reused)
            try:
                replace_durably(path, data)
                delete_snapshots(directory, lambda off: off >= start)
            except OSError as e:
                # Only restart time depends on it: the next start replays from an older one.
                log.warning("could not write producer-state snapshot of %s at %d: %s", name, offset, e)

        if wait:
            write()
        else:
            self._snapshot_job = _SNAPSHOT_WRITER.submit(write)

    def _wait_snapshot_written(self) -> None:
        job, self._snapshot_job = self._snapshot_job, None
        if job is not None:
            concurrent.futures.wait([job])

    async def _snapshots_settled(self) -> None:
        """Before snapshots are deleted or chosen: the one being written lands first (else
        it could reappear after a truncation deleted everything above the new end)."""
        job = self._snapshot_job
        if job is not None and not job.done():
            await trio.to_thread.run_sync(concurrent.futures.wait, [job])

    def _on_roll(self, base_offset: int) -> None:
        if self._replicating:
            self._pending_snapshots.append(base_offset)
        else:
            # Leader appends roll before the new batch enters the log or the state: the
            # state covers exactly the offsets below the new segment.
            self.write_snapshot(base_offset)

    def close(self) -> None:
        """Clean shutdown: flush the log, then snapshot at its (now durable) end."""
        self._wait_snapshot_written()
        self.log.close()
        lg = self.log
        # Nothing to write for an empty log (nothing to replay either) or when a snapshot
        # at the log end exists already (no append since): two fsyncs per partition would
        # add up on a broker holding thousands of them.
        if not lg.offline and lg.log_end_offset > lg.log_start_offset \
                and not snapshot_path(lg.directory, lg.log_end_offset).exists():
            self.write_snapshot(wait=True)

    # -- roles --------------------------------------------------------------------
    @property
    def leader(self) -> int:
        return self.replicas[0] if self.replicas else -1

    @property
    def is_leader(self) -> bool:
        return self.leader == self.node_id and not self.fenced

    @property
    def is_replica(self) -> bool:
        return self.node_id in self.replicas

    @property
    def children(self) -> list[int]:
        return children_of(self.replicas, self.node_id, self.fanout)

    @property
    def upstream(self) -> int | None:
        return parent_of(self.replicas, self.node_id, self.fanout)

    def set_assignment(self, replicas: list[int], fanout: int, leader_epoch: int,
                       isr: list[int] | None = None, fenced: bool = False) -> bool:
        """Apply the metadata store's decision; returns True when this broker's role changed."""
        old = (self.is_leader, self.upstream, self.leader_epoch)
        was_leader = self.is_leader
        self.fenced = fenced
        self.replicas, self.fanout = list(replicas), fanout
        epoch_changed = leader_epoch != self.leader_epoch
        self.leader_epoch = leader_epoch
        self.committed_isr = list(isr) if isr else [self.leader]
        if self.is_leader:
            self.leader_state.reset(self.children, self.committed_isr, epoch_changed or not was_leader,
                                    time.monotonic_ns() // 1_000_000)
            if epoch_changed:
                # A new leader starts its epoch at its log end; the HW it knew as a
                # follower stays (never move backwards), children's fetches advance it.
                self.epochs.note(leader_epoch, self.log.log_end_offset)
            self.maybe_advance_hw()
        elif epoch_changed and self.is_replica:
            self.needs_truncation = True
        self._wake_hw_waiters()
        self.notify_append()
        return old != (self.is_leader, self.upstream, self.leader_epoch)

    # -- high watermark and ISR ------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        if self.is_leader and len(self.replicas) == 1:
            return self.log.log_end_offset   # the only replica: every append is committed
        return min(self._hw, self.log.log_end_offset)

    def isr(self) -> list[int]:
        """The committed ISR (what Metadata reports and acks=all waits for)."""
        return list(self.committed_isr)

    def proposed_isr(self, now_ms: int) -> list[int]:
        """What this leader would ask the store to record (caught-up direct children)."""
        return self.leader_state.proposed_isr(now_ms) if self.is_leader else self.isr()

    def maybe_advance_hw(self) -> None:
        if not self.is_leader:
            return
        hw = self.leader_state.high_watermark(self.log.log_end_offset)
        if hw > self._hw:
            self._hw = hw
            self._wake_hw_waiters(hw)
            self.notify_append()

    def record_replica_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> None:
        # Where each downstream replica last fetched, at every tier (the status page shows
        # a paused grandchild's lag through its upstream; the ISR rules use leader_state).
        self.downstream_fetches[replica_id] = (fetch_offset, now_ms)
        if self.is_leader and self.leader_state.record_fetch(replica_id, fetch_offset,
                                                             self.log.log_end_offset, now_ms):
            self.maybe_advance_hw()

    def set_follower_high_watermark(self, hw: int) -> None:
        # Called once per answered fetch from the upstream: the status page's "last fetch".
        self.last_upstream_fetch_ms = time.monotonic_ns() // 1_000_000
        hw = min(hw, self.log.log_end_offset)
        if hw > self._hw:
            self._hw = hw
            self.notify_append()

    async def wait_for_high_watermark(self, offset: int, timeout_s: float) -> bool:
        """Wait until the HW covers ``offset``; gives up early when this broker stops
        leading the epoch it started waiting in (the caller then answers
        NOT_LEADER_OR_FOLLOWER rather than wait for children that follow someone else)."""
        epoch = self.leader_epoch
        with trio.move_on_after(timeout_s):
            while self.high_watermark < offset and self.leader_epoch == epoch and self.is_leader:
                ev = trio.Event()
                heapq.heappush(self._hw_waiters, (offset, next(_hw_waiter_seq), ev))
                await ev.wait()
        return self.high_watermark >= offset and self.leader_epoch == epoch

    def _wake_hw_waiters(self, hw: int | None = None) -> None:
        """Wake the acks=all answers whose offset the high watermark ``hw`` reached, or
        all of them (None: leadership, epoch or replicas changed; they look again)."""
        waiters = self._hw_waiters
        while waiters and (hw is None or waiters[0][0] <= hw):
            heapq.heappop(waiters)[2].set()

    # -- appends --------------------------------------------------------------------
    def on_leader_append(self, base_offset: int) -> None:
        self.epochs.note(self.leader_epoch, base_offset)
        if len(self.replicas) > 1:
            self.maybe_advance_hw()
        self.notify_append()

    def append_replicated(self, records) -> int:
        """Follower path: the upstream's batches, byte for byte. Returns bytes appended."""
        self._replicating = True
        try:
            self.log.append_replicated(records)   # validates headers and CRCs
        except BaseException:
            self._pending_snapshots.clear()   # the state does not follow a failed append
            raise
        finally:
            self._replicating = False
        # The producer state and epoch cache need the headers only: walk them, no second CRC.
        headers = validate_batches(records, strict=False, check_crc=False)
        pending = self._pending_snapshots
        self.replication_bytes_in += len(records)
        for h in headers:
            self.replication_messages_in += h.records_count
            while pending and h.base_offset >= pending[0]:
                self.write_snapshot(pending.pop(0))   # the state now covers exactly [.., roll)
            self.epochs.note(h.partition_leader_epoch, h.base_offset)
            if h.producer_id >= 0 and not h.is_control:
                self.producers.record(h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta,
                                      h.base_offset, h.max_timestamp)
        pending.clear()   # a roll past the last batch (none today): the next roll covers it
        self.notify_append()
        return len(records)

    async def truncate_to(self, offset: int) -> None:
        if offset >= self.log.log_end_offset:
            return
        log.warning("truncating %s-%d from %d to %d (divergent tail)", self.topic.name, self.index,
                    self.log.log_end_offset, offset)
        await self._snapshots_settled()
        self.log.truncate_to(offset)
        self._hw = min(self._hw, self.log.log_end_offset)
        # Snapshots past the new end describe batches that are gone: _restore_snapshot
        # deletes them and rebuilds from an older one plus the headers after it.
        await self._reload_state()

    async def truncate_fully_and_start_at(self, offset: int) -> None:
        """The whole log lies below the upstream's log start: it restarts empty at
        ``offset``, with no producer state and no snapshot (Kafka's truncateFullyAndStartAt)."""
        await self._snapshots_settled()
        self.log.truncate_fully_and_start_at(offset)
        delete_snapshots(self.log.directory, lambda off: False)
        self.producers, self.epochs = ProducerStateTable(), EpochCache()
        self._hw = min(self._hw, self.log.log_end_offset)

    # -- leader epochs (OffsetForLeaderEpoch) ------------------------------------------
    def latest_epoch(self) -> int:
        return self.epochs.latest()

    def truncation_point(self, upstream_epoch: int, upstream_end_offset: int) -> int:
        """Where this replica cuts its log, given its upstream's end of an epoch
        (OffsetForLeaderEpoch's answer, or a Fetch's diverging_epoch)."""
        return truncation_point(self.epochs, self.log.log_end_offset, upstream_epoch, upstream_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epochs.end_offset_for(epoch, self.log.log_end_offset,
                                          self.leader_epoch if self.is_leader else -1)

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def notify_append(self) -> None:
        """Wake every long-polling Fetch waiting on this partition (acks=all answers wait
        in ``_hw_waiters``)."""
        if self.waiters:
            for ev in self.waiters:
                ev.set()
            self.waiters.clear()


class Partitions(Sequence):
    """A topic's partitions in index order, each made at its first use. CreateTopics
    answers once topic.json is durable, as Kafka's controller answers once the topic is
    in its metadata log and brokers make the logs afterwards: building 1 000 Partition
    and Log objects first cost its answer ~2.3 ms here (issue 15 item 6). Any access by
    index, slice or iteration makes what it reaches, so every caller sees whole
    partitions; only the paths that would otherwise make them for nothing look past
    that: ``made`` (closing, deleting, pushing configs) and ``leader_epochs``
    (Metadata's answer). A partition not yet made has nothing on disk but what the
    file-maker thread puts there (empty files) and Partition's class defaults as state."""

    __slots__ = ("_items", "_make")

    def __init__(self):
        self._items: list[Partition | None] = []
        self._make = None

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if type(i) is slice:
            return [self[j] for j in range(*i.indices(len(self._items)))]
        p = self._items[i]
        if p is None:
            i = i + len(self._items) if i < 0 else i
            p = self._items[i] = self._make(i)
        return p

    def __iter__(self):
        items = self._items
        for i in range(len(items)):
            p = items[i]
            yield p if p is not None else self[i]

    def __repr__(self) -> str:
        return f"Partitions({len(self._items)}, {len(self.made())} made)"

    def append(self, p: Partition) -> None:
        self._items.append(p)

    def add_unmade(self, n: int, make) -> None:
        """``n`` more partitions, each ``make(index)`` at its first use."""
        self._items.extend([None] * n)
        self._make = make

    def is_made(self, i: int) -> bool:
        return self._items[i] is not None

    def made(self) -> list[Partition]:
        return [p for p in self._items if p is not None]

    def leader_epochs(self) -> list[int]:
        default = Partition.leader_epoch   # what a partition not yet made would hold
        return [default if p is None else p.leader_epoch for p in self._items]


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    directory: Path
    partitions: Partitions = field(default_factory=Partitions)
    # The resolved storage config every partition's log has, and a partition not yet
    # made will be given (TopicRegistry._apply_configs).
    log_config: LogConfig | None = None
    deleted = False   # set by TopicRegistry.delete: the file maker stops
    rebuilt: bool = False   # topic.json was damaged at start and rebuilt from the directory
    # compression.type resolved to a codec Produce re-encodes batches with; None for
    # "producer" (the client's codec is kept: no work on the produce path).
    target_codec: int | None = None
    # Metadata's encoded partitions per version, with what they were made of
    # (broker/handlers/metadata.py).
    metadata_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def timestamp_type(self) -> str:
        # The topic's resolved LogConfig holds it (override or inherited broker default).
        return self.log_config.message_timestamp_type if self.log_config is not None else \
            self.configs.get("message.timestamp.type", "CreateTime")

    def save(self) -> None:
        meta = {"topic_id": str(self.topic_id), "partitions": len(self.partitions), "configs": self.configs}
        replace_durably(self.directory / "topic.json", json.dumps(meta, indent=1, sort_keys=True))


def _partition_dirs(d: Path) -> list[int]:
    return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())


def _read_topic_json(path: Path) -> dict:
    """topic.json's fields, checked; ValueError (with the reason) when it is damaged."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"unreadable: {e}") from None
    if not text.strip():
        raise ValueError("empty")
    try:
        meta = json.loads(text)
        topic_id = uuid.UUID(meta["topic_id"])
        partitions = meta["partitions"]
        configs = meta.get("configs", {})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not valid topic metadata: {type(e).__name__}: {e}") from None
    if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= 10_000:
        raise ValueError(f"bad partition count {partitions!r}")
    if not isinstance(configs, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in configs.items()):
        raise ValueError("bad configs")
    return {"topic_id": topic_id, "partitions": partitions, "configs": configs}


class TopicRegistry:
    def __init__(self, data_dir: Path, config):
        self.root = Path(data_dir) / "topics"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[uuid.UUID, Topic] = {}
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if self.fd_limit == resource.RLIM_INFINITY:
            self.fd_limit = 1 << 20
        # Keep a quarter of the descriptors for connections and everything else.
        self.max_partitions = max(100, self.fd_limit * 3 // 4 // 3)
        # Dynamic broker configs (Kafka names): this broker's own and the cluster default.
        self.dynamic_broker: dict[str, str] = {}
        self.dynamic_default: dict[str, str] = {}
        # canopy's own settings, by Kafka broker config name (fixed for the process's life).
        self.static_broker_values = tc.static_broker_values(config)

    def check_partition_budget(self, adding: int) -> None:
        """Each open partition holds ~3 file descriptors (segment, index, directory for
        fsync); refuse a request that would run the broker out of them rather than leave
        a half-created topic behind."""
        total = sum(len(t.partitions) for t in self.topics.values()) + adding
        if total > self.max_partitions:
            raise TopicError(ErrorCode.POLICY_VIOLATION,
                             f"this broker can hold at most {self.max_partitions} partitions "
                             f"(open-file limit {self.fd_limit}); {total} requested in all")

    def _partition(self, topic: "Topic", index: int, log_: Log) -> Partition:
        return Partition(topic, index, log_, self.config.node_id, self.config.replica_lag_time_max_ms)

    # -- configs ---------------------------------------------------------------
    # Topic configs resolve as in Kafka (broker/topic_configs.py): the topic's override,
    # else this broker's dynamic config, the cluster-wide dynamic default, the static
    # broker setting, Kafka's default. The dynamic layers change at run time
    # (AlterConfigs on a BROKER resource), so nothing below caches a resolved value
    # except each Log's LogConfig, which set_dynamic_broker_configs rebuilds.
    def resolve(self, configs: dict[str, str], name: str) -> tc.Resolved:
        return tc.resolve(tc.TOPIC_CONFIGS[name], configs, self.dynamic_broker, self.dynamic_default,
                          self.static_broker_values)

    def config_value(self, topic: "Topic", name: str) -> str:
        """A topic config's effective value (override or inherited)."""
        v = topic.configs.get(name)
        return v if v is not None else self.resolve({}, name).value

    _STORAGE_CONFIGS = ("retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "max.message.bytes",
                        "message.timestamp.type", "cleanup.policy", "min.cleanable.dirty.ratio",
                        "min.compaction.lag.ms", "max.compaction.lag.ms", "delete.retention.ms")

    def log_config(self, topic_configs: dict[str, str]) -> LogConfig:
        return LogConfig.from_topic_configs({n: self.resolve(topic_configs, n).value for n in self._STORAGE_CONFIGS})

    def effective_configs(self, topic: Topic) -> dict[str, tc.Resolved]:
        """Every topic config, resolved, as DescribeConfigs reports them."""
        return {name: self.resolve(topic.configs, name) for name in sorted(tc.TOPIC_CONFIGS)}

    @staticmethod
    def validate_configs(configs: dict[str, str]) -> None:
        try:
            tc.validate(configs)
        except tc.ConfigError as e:
            raise TopicError(e.code, str(e)) from None

    _CODECS = {"producer": None, "uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

    def _apply_configs(self, topic: Topic) -> None:
        """Push a topic's resolved configs to what reads them on the data path: each
        partition's LogConfig (storage's limits) and the codec Produce recompresses with."""
        lc = topic.log_config = self.log_config(topic.configs)
        for p in topic.partitions.made():
            p.log.config = lc
        topic.target_codec = self._CODECS[self.resolve(topic.configs, "compression.type").value]

    def set_configs(self, topic: Topic, configs: dict[str, str]) -> None:
        """Replace a topic's overrides (AlterConfigs; or the cluster's metadata changed)
        and apply them at once: storage's limits to every partition's log, the rest is
        read per request."""
        topic.configs = dict(configs)
        topic.save()
        self._apply_configs(topic)
        log.info("topic %s configs now %s", topic.name, topic.configs or "{}")

    def set_dynamic_broker_configs(self, default: dict[str, str], this_broker: dict[str, str]) -> None:
        """The dynamic broker configs changed: every topic's inherited values follow."""
        if default == self.dynamic_default and this_broker == self.dynamic_broker:
            return
        self.dynamic_default, self.dynamic_broker = dict(default), dict(this_broker)
        for t in self.topics.values():
            self._apply_configs(t)
        log.info("dynamic broker configs now: default %s, this broker %s", default or "{}", this_broker or "{}")

    # -- lifecycle -------------------------------------------------------------
    def load(self) -> None:
        """Open every topic under the data directory. A damaged topic.json (empty, torn,
        not JSON, missing fields) never stops the broker: the topic is rebuilt from what
        its directory shows, or, when nothing can be rebuilt, left offline (its files
        untouched) with one ERROR line; every other topic is served."""
        damaged = []
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                continue
            meta_path = d / "topic.json"
            if d.name.endswith(".deleting"):
                shutil.rmtree(d, ignore_errors=True)
                continue
            if not meta_path.exists():
                # delete() unlinks topic.json before renaming the directory away, and
                # create() writes it last: without it the directory is no topic.
                continue
            try:
                meta = _read_topic_json(meta_path)
            except ValueError as e:
                damaged.append((d, str(e)))
                continue
            self._open_topic(d, meta["topic_id"], meta["configs"], meta["partitions"])
        for d, why in damaged:
            parts = _partition_dirs(d)
            if not parts:
                log.error("%s is damaged (%s) and %s holds no partition logs: topic %s is offline",
                          d / "topic.json", why, d, d.name)
                continue
            try:
                # A new id and the broker defaults; in a cluster the broker adopts the
                # cluster's id and configs for it when it reads the metadata store
                # (broker/cluster.py), instead of taking it for a deleted topic.
                topic = self._open_topic(d, uuid.uuid4(), {}, max(parts) + 1, log_loaded=False)
                topic.rebuilt = True
                topic.save()
            except (OSError, ValueError, TopicError) as e:
                log.error("%s is damaged (%s) and the topic could not be rebuilt (%s): topic %s is offline",
                          d / "topic.json", why, e, d.name)
                continue
            log.error("%s is damaged (%s): rebuilt from %s: %d partitions, a new topic id and the broker "
                      "default configs (a cluster member takes both from the metadata store)",
                      d / "topic.json", why, d, len(topic.partitions))

    def _open_topic(self, d: Path, topic_id: uuid.UUID, configs: dict, partitions: int,
                    log_loaded: bool = True) -> Topic:
        topic = Topic(d.name, topic_id, configs, d)
        self._apply_configs(topic)
        for i in range(partitions):
            topic.partitions.append(self._partition(topic, i, Log(d / str(i), topic.log_config)))
        self.topics[topic.name] = topic
        self.by_id[topic.topic_id] = topic
        if log_loaded:
            log.info("loaded topic %s (%d partitions)", topic.name, len(topic.partitions))
        return topic

    def adopt(self, topic: Topic, topic_id: uuid.UUID, configs: dict[str, str]) -> None:
        """Give a rebuilt topic the identity the cluster knows it by."""
        self.by_id.pop(topic.topic_id, None)
        topic.topic_id, topic.configs, topic.rebuilt = topic_id, configs, False
        self.by_id[topic_id] = topic
        topic.save()
        self._apply_configs(topic)
        log.info("topic %s: topic id and configs from the cluster metadata (id %s)", topic.name, topic_id)

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def partition(self, name: str, index: int) -> Partition | None:
        t = self.topics.get(name)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]

    def create(self, name: str, num_partitions: int, configs: dict[str, str] | None = None,
               *, validate_only: bool = False, topic_id: uuid.UUID | None = None) -> Topic | None:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "number of partitions must be at least 1")
        if num_partitions > 10_000:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "at most 10000 partitions per topic")
        configs = dict(configs or {})
        self.validate_configs(configs)
        self.check_partition_budget(num_partitions)
        if validate_only:
            return None
        d = self.root / name
        try:
            d.mkdir()
            new = True
        except FileExistsError:
            new = False
        topic = Topic(name, topic_id or uuid.uuid4(), configs, d)
        self._apply_configs(topic)
        if new:
            # No directory, file or object per partition yet: each partition is made at
            # its first use (Partitions), and its log makes its directory and segment at
            # its first append (storage/log.py); the partition count in topic.json is what
            # makes a partition exist, so a crash before that append leaves an empty one.
            topic.partitions.add_unmade(num_partitions, lambda i: self._partition(
                topic, i, Log(f"{d}/{i}", topic.log_config, new=True)))
        else:
            # Leftovers of a create or delete cut short (no topic.json, so load() skipped
            # them): partition directories found there are opened as before.
            for i in range(num_partitions):
                topic.partitions.append(self._partition(topic, i, Log(f"{d}/{i}", topic.log_config)))
        # Acknowledged means durable: topic.json (file, then the topic directory's fsync
        # in save()), then the topics directory, whose entry for the new topic directory
        # a machine crash could otherwise lose. Three fsyncs per topic, none per partition.
        topic.save()
        fsync_path(self.root)
        _FILE_MAKER.submit(_make_files_ahead, topic, 0)
        self.topics[name] = topic
        self.by_id[topic.topic_id] = topic
        log.info("created topic %s with %d partitions %s", name, num_partitions, configs or "")
        return topic

    def add_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        if total <= len(topic.partitions):
            raise TopicError(ErrorCode.INVALID_PARTITIONS,
                             f"topic {name!r} has {len(topic.partitions)} partitions; "
                             f"the count can only grow")
        if total > 10_000:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "at most 10000 partitions per topic")
        self.check_partition_budget(total - len(topic.partitions))
        if validate_only:
            return
        first_new = len(topic.partitions)
        for i in range(first_new, total):
            topic.partitions.append(self._partition(topic, i, Log(topic.directory / str(i), topic.log_config)))
        topic.save()
        _FILE_MAKER.submit(_make_files_ahead, topic, first_new)

    def delete(self, name: str) -> Topic:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        self.by_id.pop(topic.topic_id, None)
        # Rename first so a crash mid-delete never resurrects a half-deleted topic.
        graveyard = topic.directory.with_name(topic.directory.name + f".{uuid.uuid4().hex[:8]}.deleting")
        (topic.directory / "topic.json").unlink(missing_ok=True)
        topic.deleted = True
        for p in topic.partitions.made():   # one not made has no waiter and nothing open
            p.log.close(flush=False)   # no fsync on the event loop for data being deleted
            p.notify_append()
        os.replace(topic.directory, graveyard)
        shutil.rmtree(graveyard, ignore_errors=True)
        log.info("deleted topic %s", name)
        return topic

    def all_partitions(self):
        for t in list(self.topics.values()):
            yield from t.partitions

    def close(self) -> None:
        for t in list(self.topics.values()):
            for p in t.partitions.made():   # one not made has nothing open or to flush
                p.close()
