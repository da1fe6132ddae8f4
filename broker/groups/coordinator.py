"""The group coordinator: every group on this broker, their timers, committed offsets.

As in Kafka, group G belongs to partition ``abs(hash(G)) % N`` of ``__consumer_offsets``
and its coordinator is that partition's leader: a single broker leads the one partition
of its own topic; in a cluster the controller creates the topic with
``offsets-topic-num-partitions`` partitions replicated like any topic, FindCoordinator
names the leader, and any other broker answers NOT_COORDINATOR (clients look again). A
broker that becomes leader of an offsets partition loads it (replays its log) before it
answers for its groups; one that loses it drops them.

Membership lives in ``Group`` objects (group.py, a sans-IO state machine); this class
owns the clock (trio's, so tests can use ``trio.testing.MockClock``), the one timer task
that drives session expiry and the join/sync deadlines, and the durable offsets log
(offsets_log.py). A commit is acknowledged once the committed ISR of its partition holds
it (acks=all), and after the flush policy's fsync.

Membership is not persisted: after a restart or a coordinator move members get
UNKNOWN_MEMBER_ID or NOT_COORDINATOR and rejoin, which every client handles.
"""
from __future__ import annotations

import logging
import struct
import time

import trio

from protocol.errors import ErrorCode
from protocol.records import build_batch
from storage import LogOffline

from .group import (DEAD, EMPTY, Group, JoinResult, SyncResult, Waiter)
from .offsets_log import (MAX_METADATA_BYTES, OFFSETS_TOPIC, OffsetEntry, OffsetTable, encode_key,
                          encode_value, offsets_topic_configs, partition_for)

log = logging.getLogger("canopy.groups")

# Kafka's group.min.session.timeout.ms / group.max.session.timeout.ms defaults. Clients'
# defaults fit: kafka-python 10 s, librdkafka and the Java client 45 s.
MIN_SESSION_TIMEOUT_MS = 6000
MAX_SESSION_TIMEOUT_MS = 1_800_000
# Keep one offsets batch well below max.message.bytes (1 MiB default).
_BATCH_BUDGET = 256 * 1024
# Snapshot-compact __consumer_offsets when it holds this many records and 4x the live ones.
COMPACT_MIN_RECORDS = 10_000
# Kafka's offsets.commit.timeout.ms: how long a commit waits for the ISR.
OFFSETS_COMMIT_TIMEOUT_S = 5.0


def _end(g: Group, error: int) -> None:
    """This broker stops coordinating ``g``: members waiting in a join or sync get
    ``error`` (clients then look the coordinator up again)."""
    for m in g.members.values():
        if m.join_waiter:
            m.join_waiter.complete(JoinResult(error, m.member_id))
        if m.sync_waiter:
            m.sync_waiter.complete(SyncResult(error))
    g.state = DEAD


class CoordinatorMoved(Exception):
    """This broker stopped leading the group's offsets partition during a commit."""


def _subscribed_topics(g: Group) -> set[str] | None:
    """Topics the members of a consumer group subscribe to, read from their
    ConsumerProtocolSubscription (int16 version, then an array of int16-length strings);
    None when one cannot be read (then every topic counts as subscribed, the safe side)."""
    out: set[str] = set()
    for m in g.members.values():
        data = bytes(m.metadata(g.protocol_name) if g.protocol_name else (m.protocols[0][1] if m.protocols else b""))
        try:
            (n,) = struct.unpack_from(">i", data, 2)
            pos = 6
            for _ in range(n):
                (ln,) = struct.unpack_from(">h", data, pos)
                out.add(data[pos + 2:pos + 2 + ln].decode())
                pos += 2 + ln
        except (struct.error, UnicodeDecodeError):
            return None
    return out


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupCoordinator:
    def __init__(self, broker):
        self.broker = broker
        cfg = broker.config
        self.initial_rebalance_delay_ms = getattr(cfg, "group_initial_rebalance_delay_ms", 0)
        self.min_session_timeout_ms = getattr(cfg, "group_min_session_timeout_ms", MIN_SESSION_TIMEOUT_MS)
        self.max_session_timeout_ms = getattr(cfg, "group_max_session_timeout_ms", MAX_SESSION_TIMEOUT_MS)
        self.groups: dict[str, Group] = {}
        self.offsets = OffsetTable()
        self._wake: trio.Event | None = None
        self._loaded = False
        self._compacting = False
        self.compact_min_records = COMPACT_MIN_RECORDS
        self._led: set[int] = set()   # offsets partitions this broker leads and has loaded

    # -- lifecycle -----------------------------------------------------------------
    def load(self) -> None:
        """Single node: create ``__consumer_offsets`` (one partition) or load it. In a
        cluster the controller creates it and leadership changes load it. Idempotent."""
        if self._loaded:
            return
        self._loaded = True
        if self.broker.cluster.enabled:
            return
        topic = self.broker.topics.get(OFFSETS_TOPIC)
        if topic is None:
            topic = self.broker.topics.create(OFFSETS_TOPIC, 1, offsets_topic_configs(1, self.broker.config.offsets_topic_segment_bytes))
        for p in topic.partitions:
            self.on_partition_change(p, lost=False)

    def _partition_count(self) -> int:
        topic = self.broker.topics.get(OFFSETS_TOPIC)
        return len(topic.partitions) if topic is not None else 0

    def on_partition_change(self, partition, lost: bool) -> None:
        """Leadership of an offsets partition arrived (load it) or left (drop its groups)."""
        if partition.topic.name != OFFSETS_TOPIC:
            return
        index = partition.index
        if not lost and partition.is_leader and index not in self._led:
            n = self.offsets.replay(partition.log)
            self._led.add(index)
            count = self._partition_count()
            for gid in self.offsets.groups:
                if partition_for(gid, count) == index:
                    # Kafka loads groups that only have offsets as Empty groups (ListGroups shows them).
                    self._group(gid, create=True)
            log.info("coordinator for %s-%d: loaded %d committed offset record(s)", OFFSETS_TOPIC, index, n)
        elif (lost or not partition.is_leader) and index in self._led:
            self._led.discard(index)
            count = self._partition_count() or index + 1
            for gid in [g for g in set(self.groups) | set(self.offsets.groups) if partition_for(g, count) == index]:
                g = self.groups.pop(gid, None)
                if g is not None:
                    _end(g, ErrorCode.NOT_COORDINATOR)
                self.offsets.groups.pop(gid, None)
            log.info("no longer the coordinator for %s-%d", OFFSETS_TOPIC, index)

    def coordinator_error(self, group_id: str) -> int:
        """NONE when this broker coordinates ``group_id``; else what Kafka answers."""
        count = self._partition_count()
        if count == 0:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        index = partition_for(group_id, count)
        p = self.broker.topics.partition(OFFSETS_TOPIC, index)
        if p is None or not p.is_leader or not self.broker.cluster.ready:
            return ErrorCode.NOT_COORDINATOR
        if index not in self._led:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.load()
        self._wake = trio.Event()
        task_status.started()
        while True:
            deadline = min((d for g in self.groups.values()
                            if (d := g.next_deadline()) is not None), default=float("inf"))
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            self.tick()

    def tick(self) -> None:
        now = trio.current_time()
        for gid, g in list(self.groups.items()):
            g.tick(now)
            if g.state == EMPTY and g.is_empty_membership() and not self.offsets.of_group(gid):
                # Kafka removes Empty groups without offsets (they would otherwise pile up,
                # e.g. from clients that got MEMBER_ID_REQUIRED and went away).
                del self.groups[gid]

    def _kick(self) -> None:
        """Deadlines changed: let the timer task recompute its sleep."""
        if self._wake is not None:
            self._wake.set()

    def close(self) -> None:
        for g in self.groups.values():
            _end(g, ErrorCode.COORDINATOR_NOT_AVAILABLE)

    def _group(self, group_id: str, create: bool = False) -> Group | None:
        g = self.groups.get(group_id)
        if g is None and create:
            g = self.groups[group_id] = Group(
                group_id, initial_rebalance_delay_ms=self.initial_rebalance_delay_ms)
        return g

    async def _await(self, result):
        if isinstance(result, Waiter):
            self._kick()
            result = await result.wait()
        else:
            self._kick()
        return result

    # -- membership ------------------------------------------------------------------
    async def join(self, group_id: str, *, member_id: str, group_instance_id: str | None,
                   client_id: str, client_host: str, session_timeout_ms: int,
                   rebalance_timeout_ms: int, protocol_type: str, protocols: list,
                   require_known_member_id: bool) -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id)
        if err := self.coordinator_error(group_id):
            return JoinResult(err, member_id)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        g = self._group(group_id)
        if g is None:
            if member_id:
                # Kafka: a member id for a group we do not know is stale (e.g. after restart).
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            g = self._group(group_id, create=True)
        r = g.join(trio.current_time(), member_id=member_id, group_instance_id=group_instance_id,
                   client_id=client_id, client_host=client_host,
                   session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
                   protocol_type=protocol_type, protocols=protocols,
                   require_known_member_id=require_known_member_id)
        return await self._await(r)

    async def sync(self, group_id: str, *, member_id: str, group_instance_id: str | None,
                   generation_id: int, protocol_type: str | None, protocol_name: str | None,
                   assignments: dict[str, bytes]) -> SyncResult:
        if err := self.coordinator_error(group_id):
            return SyncResult(err)
        g = self._group(group_id)
        if g is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        r = g.sync(trio.current_time(), member_id=member_id, group_instance_id=group_instance_id,
                   generation_id=generation_id, protocol_type=protocol_type,
                   protocol_name=protocol_name, assignments=assignments)
        return await self._await(r)

    def heartbeat(self, group_id: str, *, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> int:
        if err := self.coordinator_error(group_id):
            return err
        g = self._group(group_id)
        if g is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        err = g.heartbeat(trio.current_time(), member_id=member_id,
                          group_instance_id=group_instance_id, generation_id=generation_id)
        self._kick()
        return err

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[tuple[str, str | None, int]]:
        """[(member_id, group_instance_id)] -> [(member_id, group_instance_id, error)]."""
        if err := self.coordinator_error(group_id):
            return [(mid, iid, err) for mid, iid in members]
        g = self._group(group_id)
        if g is None:
            return [(mid, iid, ErrorCode.UNKNOWN_MEMBER_ID) for mid, iid in members]
        now = trio.current_time()
        out = []
        for mid, iid in members:
            resolved, err = g.leave(now, mid, iid)
            out.append((resolved or mid, iid, err))
        self._kick()
        return out

    # -- offsets ---------------------------------------------------------------------
    async def commit(self, group_id: str, *, member_id: str, group_instance_id: str | None,
                     generation_id: int, offsets: list) -> dict[tuple[str, int], int]:
        """``offsets``: [(topic, partition, offset, leader_epoch, metadata)].
        Returns {(topic, partition): error} for every entry."""
        if not group_id:
            return {(t, p): ErrorCode.INVALID_GROUP_ID for t, p, *_ in offsets}
        if err := self.coordinator_error(group_id):
            return {(t, p): err for t, p, *_ in offsets}
        g = self._group(group_id)
        if g is None:
            if generation_id >= 0:
                # Kafka: a generation for a group that does not exist is stale.
                return {(t, p): ErrorCode.ILLEGAL_GENERATION for t, p, *_ in offsets}
            g = self._group(group_id, create=True)
        err = g.validate_commit(trio.current_time(), member_id, group_instance_id, generation_id)
        if err:
            return {(t, p): err for t, p, *_ in offsets}
        result: dict[tuple[str, int], int] = {}
        records = []
        ts = _now_ms()
        registry = self.broker.topics
        for topic, partition, offset, epoch, metadata in offsets:
            if metadata is not None and len(metadata.encode("utf-8")) > MAX_METADATA_BYTES:
                result[(topic, partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            if registry.partition(topic, partition) is None:
                result[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            entry = OffsetEntry(offset, epoch, metadata, ts)
            records.append(((topic, partition), entry))
        if records:
            try:
                await self._persist(group_id, records)
            except (CoordinatorMoved, LogOffline) as e:
                # Kafka's GroupMetadataManager answers a commit whose append failed with
                # KAFKA_STORAGE_ERROR (an offline offsets log) as NOT_COORDINATOR too: the
                # client looks the coordinator up again and retries there.
                log.warning("commit of group %r not acknowledged: %s", group_id, e)
                for k, _ in records:
                    result[k] = ErrorCode.NOT_COORDINATOR
                return result
            except Exception:
                log.exception("could not write committed offsets of group %r", group_id)
                for k, _ in records:
                    result[k] = ErrorCode.UNKNOWN_SERVER_ERROR
                return result
            self._group(group_id, create=True)   # the timer may have dropped it meanwhile
            for (topic, partition), entry in records:
                self.offsets.put(group_id, topic, partition, entry)
                result[(topic, partition)] = ErrorCode.NONE
            try:
                await self.maybe_compact(partition_for(group_id, self._partition_count()))
            except Exception:
                log.exception("compacting %s failed (will retry on a later commit)", OFFSETS_TOPIC)
        return result

    async def _persist(self, group_id: str, records: list) -> None:
        part = self.broker.topics.partition(OFFSETS_TOPIC, partition_for(group_id, self._partition_count()))
        batch, size = [], 0
        batches = []
        for (topic, partition), e in records:
            # e None: a tombstone (DeleteGroups, OffsetDelete)
            k, v = encode_key(group_id, topic, partition), encode_value(e) if e is not None else None
            if batch and size + len(k) + len(v or b"") > _BATCH_BUDGET:
                batches.append(batch)
                batch, size = [], 0
            batch.append((k, v, [], e.commit_timestamp if e is not None else None))
            size += len(k) + len(v or b"") + 32
        batches.append(batch)
        epoch = part.leader_epoch
        for b in batches:
            result = part.log.append(build_batch(b), leader_epoch=epoch)
            part.on_leader_append(result.base_offset)
        end = part.log.log_end_offset
        self.broker.flusher.mark_dirty(part.log)
        await self.broker.flusher.wait_durable()
        if len(part.replicas) > 1:
            # Kafka appends commits with acks=all: acknowledged once the committed ISR holds
            # them, so they survive the loss of the leader and its disk.
            if len(part.isr()) < int(self.broker.topics.config_value(part.topic, "min.insync.replicas")):
                raise CoordinatorMoved(f"ISR {part.isr()} of {OFFSETS_TOPIC}-{part.index} is below "
                                       f"min.insync.replicas")
            if not await part.wait_for_high_watermark(end, OFFSETS_COMMIT_TIMEOUT_S):
                raise CoordinatorMoved(f"not replicated to the ISR {part.isr()} within "
                                       f"{OFFSETS_COMMIT_TIMEOUT_S:.0f} s")
        if part.leader_epoch != epoch or not part.is_leader:
            raise CoordinatorMoved(f"leadership of {OFFSETS_TOPIC}-{part.index} moved while committing")

    async def maybe_compact(self, index: int = 0) -> bool:
        """Snapshot compaction of ``__consumer_offsets``: append the live table (newest
        records win on replay, so the snapshot alone rebuilds it), make it durable, then
        advance the log start offset to the snapshot's first offset. A crash at any point
        leaves a log that replays to the same table."""
        part = self.broker.topics.partition(OFFSETS_TOPIC, index)
        if part is None or self._compacting or not part.is_leader or part.log.config.compact:
            return False   # a compacted offsets topic is the log cleaner's (storage/cleaner.py)
        log_ = part.log
        count = self._partition_count()
        mine = {gid: t for gid, t in self.offsets.groups.items() if partition_for(gid, count) == index}
        live = sum(len(t) for t in mine.values())
        if log_.log_end_offset - log_.log_start_offset < max(self.compact_min_records, 4 * live):
            return False
        self._compacting = True
        try:
            start = log_.log_end_offset
            # No await until every snapshot batch is appended: commits cannot interleave.
            for gid, table in list(mine.items()):
                batch, size = [], 0
                for (topic, partition), e in table.items():
                    k, v = encode_key(gid, topic, partition), encode_value(e)
                    if batch and size + len(k) + len(v) > _BATCH_BUDGET:
                        part.on_leader_append(log_.append(build_batch(batch), leader_epoch=part.leader_epoch).base_offset)
                        batch, size = [], 0
                    batch.append((k, v, [], e.commit_timestamp))
                    size += len(k) + len(v) + 32
                if batch:
                    part.on_leader_append(log_.append(build_batch(batch), leader_epoch=part.leader_epoch).base_offset)
            await trio.to_thread.run_sync(log_.flush)
            log_.delete_records_before(start)
            log.info("compacted %s: %d live offset(s), log start offset now %d",
                     OFFSETS_TOPIC, live, log_.log_start_offset)
            return True
        finally:
            self._compacting = False

    async def forget_topic(self, topic: str) -> int:
        """Drop every group's committed offsets for a deleted topic (Kafka does so on
        topic deletion, so a recreated topic does not inherit stale positions). Writes
        tombstones, so the removal survives restarts. Returns how many were dropped."""
        doomed = [(gid, t, p) for gid in list(self.offsets.groups)
                  for (t, p) in self.offsets.of_group(gid) if t == topic]
        if not doomed:
            return 0
        count = self._partition_count()
        by_partition: dict[int, list] = {}
        for d in doomed:
            by_partition.setdefault(partition_for(d[0], count), []).append(d)
        for index, items in by_partition.items():
            part = self.broker.topics.partition(OFFSETS_TOPIC, index)
            if part is None or not part.is_leader:
                continue
            for i in range(0, len(items), 1000):
                result = part.log.append(build_batch([(encode_key(gid, t, p), None, [], None)
                                                      for gid, t, p in items[i:i + 1000]]),
                                         leader_epoch=part.leader_epoch)
                part.on_leader_append(result.base_offset)
            self.broker.flusher.mark_dirty(part.log)
        for gid, t, p in doomed:
            self.offsets.put(gid, t, p, None)
        await self.broker.flusher.wait_durable()
        return len(doomed)

    def fetch(self, group_id: str, topics: list[tuple[str, list[int]]] | None) -> list:
        """Committed offsets: [(topic, [(partition, OffsetEntry | None)])]. ``topics`` None
        means every partition the group has an offset for."""
        table = self.offsets.of_group(group_id)
        if topics is None:
            by_topic: dict[str, list] = {}
            for (t, p), e in sorted(table.items()):
                by_topic.setdefault(t, []).append((p, e))
            return list(by_topic.items())
        return [(t, [(p, table.get((t, p))) for p in parts]) for t, parts in topics]

    # -- admin -----------------------------------------------------------------------
    async def delete_group(self, group_id: str) -> int:
        """DeleteGroups: Kafka deletes only a group without members (Empty, or Dead with
        offsets), writing tombstones for its offsets. Returns the error code."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        if err := self.coordinator_error(group_id):
            return err
        g = self.groups.get(group_id)
        table = self.offsets.of_group(group_id)
        if (g is None or g.state == DEAD) and not table:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if g is not None and g.state not in (EMPTY, DEAD):
            return ErrorCode.NON_EMPTY_GROUP
        err = await self._tombstone(group_id, list(table))
        if err:
            return err
        g = self.groups.pop(group_id, None)
        if g is not None:
            g.state = DEAD
        log.info("deleted group %r (%d committed offset(s))", group_id, len(table))
        return ErrorCode.NONE

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> tuple[int, dict]:
        """OffsetDelete: (group error, {(topic, partition): error}). As Kafka's
        GroupCoordinator.handleDeleteOffsets: a consumer group may drop offsets of topics
        none of its members subscribes to (GROUP_SUBSCRIBED_TO_TOPIC otherwise); a group of
        another protocol only while it has no members (NON_EMPTY_GROUP)."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID, {}
        if err := self.coordinator_error(group_id):
            return err, {}
        g = self.groups.get(group_id)
        table = self.offsets.of_group(group_id)
        if (g is None or g.state == DEAD) and not table:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        subscribed: set[str] | None = set()
        if g is not None and g.members:
            if g.protocol_type != "consumer":
                return ErrorCode.NON_EMPTY_GROUP, {}
            subscribed = _subscribed_topics(g)
        result, doomed = {}, []
        for t, p in partitions:
            if self.broker.topics.partition(t, p) is None:
                result[(t, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif subscribed is None or t in subscribed:
                result[(t, p)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                result[(t, p)] = ErrorCode.NONE
                if (t, p) in table:
                    doomed.append((t, p))
        err = await self._tombstone(group_id, doomed)
        if err:
            return err, {}
        return ErrorCode.NONE, result

    async def _tombstone(self, group_id: str, partitions: list) -> int:
        """Write tombstones for a group's offsets (acknowledged like a commit: durable and
        on the committed ISR), then forget them. Returns an error code."""
        if not partitions:
            return ErrorCode.NONE
        try:
            await self._persist(group_id, [(tp, None) for tp in partitions])
        except CoordinatorMoved as e:
            log.info("offset deletion for group %r not acknowledged: %s", group_id, e)
            return ErrorCode.NOT_COORDINATOR
        for t, p in partitions:
            self.offsets.put(group_id, t, p, None)
        return ErrorCode.NONE

    def list_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.state != DEAD]

    def describe(self, group_id: str) -> dict:
        g = self.groups.get(group_id)
        if g is None:
            # Kafka answers an unknown group with state Dead and no error.
            return {"group_id": group_id, "group_state": DEAD, "protocol_type": "",
                    "protocol_data": "", "members": []}
        return g.describe()
