"""The group coordinator: every group on this broker, their timers, committed offsets.

Single node, so this broker coordinates every group. Membership lives in ``Group``
objects (group.py, a sans-IO state machine); this class owns the clock (trio's, so tests
can use ``trio.testing.MockClock``), the one timer task that drives session expiry and
the join/sync deadlines, and the durable offsets log (offsets_log.py).

Membership is not persisted: after a restart members get UNKNOWN_MEMBER_ID on their next
heartbeat and rejoin, which every client handles. Committed offsets are persisted.
"""
from __future__ import annotations

import logging
import time

import trio

from protocol.errors import ErrorCode
from protocol.records import build_batch

from .group import (DEAD, EMPTY, Group, JoinResult, SyncResult, Waiter)
from .offsets_log import (MAX_METADATA_BYTES, OFFSETS_TOPIC, OFFSETS_TOPIC_CONFIGS, OffsetEntry,
                          OffsetTable, encode_key, encode_value)

log = logging.getLogger("canopy.groups")

# Kafka's group.min.session.timeout.ms / group.max.session.timeout.ms defaults. Clients'
# defaults fit: kafka-python 10 s, librdkafka and the Java client 45 s.
MIN_SESSION_TIMEOUT_MS = 6000
MAX_SESSION_TIMEOUT_MS = 1_800_000
# Keep one offsets batch well below max.message.bytes (1 MiB default).
_BATCH_BUDGET = 256 * 1024
# Snapshot-compact __consumer_offsets when it holds this many records and 4x the live ones.
COMPACT_MIN_RECORDS = 10_000


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

    # -- lifecycle -----------------------------------------------------------------
    def load(self) -> None:
        """Create or replay ``__consumer_offsets``. Idempotent."""
        if self._loaded:
            return
        self._loaded = True
        topic = self.broker.topics.get(OFFSETS_TOPIC)
        if topic is None:
            topic = self.broker.topics.create(OFFSETS_TOPIC, 1, dict(OFFSETS_TOPIC_CONFIGS))
        n = self.offsets.replay(topic.partitions[0].log)
        for gid in self.offsets.groups:
            # Kafka loads groups that only have offsets as Empty groups (ListGroups shows them).
            self._group(gid, create=True)
        if n:
            log.info("loaded %d committed offset record(s) for %d group(s)", n, len(self.offsets.groups))

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
            for m in g.members.values():
                if m.join_waiter:
                    m.join_waiter.complete(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, m.member_id))
                if m.sync_waiter:
                    m.sync_waiter.complete(SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            g.state = DEAD

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
        g = self._group(group_id)
        if g is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        r = g.sync(trio.current_time(), member_id=member_id, group_instance_id=group_instance_id,
                   generation_id=generation_id, protocol_type=protocol_type,
                   protocol_name=protocol_name, assignments=assignments)
        return await self._await(r)

    def heartbeat(self, group_id: str, *, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> int:
        g = self._group(group_id)
        if g is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        err = g.heartbeat(trio.current_time(), member_id=member_id,
                          group_instance_id=group_instance_id, generation_id=generation_id)
        self._kick()
        return err

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[tuple[str, str | None, int]]:
        """[(member_id, group_instance_id)] -> [(member_id, group_instance_id, error)]."""
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
                await self.maybe_compact()
            except Exception:
                log.exception("compacting %s failed (will retry on a later commit)", OFFSETS_TOPIC)
        return result

    async def _persist(self, group_id: str, records: list) -> None:
        part = self.broker.topics.partition(OFFSETS_TOPIC, 0)
        if part is None:   # someone deleted the internal topic: recreate it
            self.broker.topics.create(OFFSETS_TOPIC, 1, dict(OFFSETS_TOPIC_CONFIGS))
            part = self.broker.topics.partition(OFFSETS_TOPIC, 0)
        batch, size = [], 0
        batches = []
        for (topic, partition), e in records:
            k, v = encode_key(group_id, topic, partition), encode_value(e)
            if batch and size + len(k) + len(v) > _BATCH_BUDGET:
                batches.append(batch)
                batch, size = [], 0
            batch.append((k, v, [], e.commit_timestamp))
            size += len(k) + len(v) + 32
        batches.append(batch)
        for b in batches:
            part.log.append(build_batch(b), leader_epoch=part.leader_epoch)
        part.notify_append()
        self.broker.flusher.mark_dirty(part.log)
        await self.broker.flusher.wait_durable()

    async def maybe_compact(self) -> bool:
        """Snapshot compaction of ``__consumer_offsets``: append the live table (newest
        records win on replay, so the snapshot alone rebuilds it), make it durable, then
        advance the log start offset to the snapshot's first offset. A crash at any point
        leaves a log that replays to the same table."""
        part = self.broker.topics.partition(OFFSETS_TOPIC, 0)
        if part is None or self._compacting:
            return False
        log_ = part.log
        live = sum(len(t) for t in self.offsets.groups.values())
        if log_.log_end_offset - log_.log_start_offset < max(self.compact_min_records, 4 * live):
            return False
        self._compacting = True
        try:
            start = log_.log_end_offset
            # No await until every snapshot batch is appended: commits cannot interleave.
            for gid, table in list(self.offsets.groups.items()):
                batch, size = [], 0
                for (topic, partition), e in table.items():
                    k, v = encode_key(gid, topic, partition), encode_value(e)
                    if batch and size + len(k) + len(v) > _BATCH_BUDGET:
                        log_.append(build_batch(batch), leader_epoch=part.leader_epoch)
                        batch, size = [], 0
                    batch.append((k, v, [], e.commit_timestamp))
                    size += len(k) + len(v) + 32
                if batch:
                    log_.append(build_batch(batch), leader_epoch=part.leader_epoch)
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
        part = self.broker.topics.partition(OFFSETS_TOPIC, 0)
        if part is not None:
            for i in range(0, len(doomed), 1000):
                part.log.append(build_batch([(encode_key(gid, t, p), None, [], None)
                                             for gid, t, p in doomed[i:i + 1000]]),
                                leader_epoch=part.leader_epoch)
            self.broker.flusher.mark_dirty(part.log)
        for gid, t, p in doomed:
            self.offsets.put(gid, t, p, None)
        if part is not None:
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
    def list_groups(self) -> list[Group]:
        return [g for g in self.groups.values() if g.state != DEAD]

    def describe(self, group_id: str) -> dict:
        g = self.groups.get(group_id)
        if g is None:
            # Kafka answers an unknown group with state Dead and no error.
            return {"group_id": group_id, "group_state": DEAD, "protocol_type": "",
                    "protocol_data": "", "members": []}
        return g.describe()
