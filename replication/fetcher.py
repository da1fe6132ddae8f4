"""A follower's fetch loop towards one upstream (the leader or another follower).

It is the Kafka replica fetcher: Fetch with replica_id = our node id, starting at our log
end offset, appending the upstream's batches byte for byte (same offsets, same CRCs,
same leader epochs) and taking the high watermark from each response. Fetches run in a
KIP-227 session (fetch_session.py): each names only the partitions whose fetch state
changed, and the upstream answers only those with news. Before fetching
for a partition whose leader epoch changed, it asks the upstream where its own log
diverged (OffsetForLeaderEpoch, KIP-101/279) and truncates the divergent tail. Every
Fetch also carries the epoch of its last batch (last_fetched_epoch); an upstream whose
log diverged from ours answers diverging_epoch (KIP-320/595) and we truncate before
appending, so a tail survives at no tier of the tree. When metadata gives it a partition
that its Fetch waiting upstream does not cover, the fetcher gives that long poll up
(``partitions_changed``) instead of letting the new partition wait out
replica.fetch.wait.max.ms.

The partitions are duck-typed (``log``, ``append_replicated``, ``truncate_to`` and
``truncate_fully_and_start_at`` (async: they wait for a snapshot being written and may
replay producer state in a worker thread),
``set_follower_high_watermark``, ``latest_epoch``, ``truncation_point``,
``needs_truncation``, ``leader_epoch``), so this module does not depend on broker/.
"""
from __future__ import annotations

import logging
from typing import Callable

import trio

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import InvalidRecordBatch

from .client import PeerConnection, PeerError
from .client_security import PLAINTEXT, ClientSecurity
from .fetch_session import FetchSessionHandler

log = logging.getLogger("canopy.replication")

FETCH_VERSION = 12
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
PARTITION_MAX_BYTES = 8 << 20
RESPONSE_MAX_BYTES = 64 << 20


def _partition_fields(key: tuple[str, int], state: tuple[int, int, int, int]) -> dict:
    leader_epoch, log_end, last_epoch, log_start = state
    return {"partition": key[1], "current_leader_epoch": leader_epoch, "fetch_offset": log_end,
            "last_fetched_epoch": last_epoch, "log_start_offset": log_start,
            "partition_max_bytes": PARTITION_MAX_BYTES}


class UpstreamFetcher:
    def __init__(self, node_id: int, upstream_id: int, address: tuple[str, int],
                 partitions: Callable[[], list], on_appended: Callable[[object], None],
                 wait_ms: int = 500, changed: Callable[[], trio.Event] | None = None,
                 security: ClientSecurity = PLAINTEXT):
        self.node_id = node_id
        self.upstream_id = upstream_id
        self.address = address
        self.partitions = partitions
        self.on_appended = on_appended
        self.wait_ms = wait_ms
        self.changed = changed
        # The upstream's inter-broker listener may be TLS and/or SASL (client_security.py).
        self.conn = PeerConnection(address[0], address[1], client_id=f"canopy-replica-{node_id}", security=security)
        # KIP-227: after the first Fetch, name only the partitions whose fetch state changed.
        self.session = FetchSessionHandler()
        # The Fetch waiting upstream: its cancel scope, and every partition this fetcher
        # followed when it was sent (those still waiting for their truncation included).
        self._in_flight: tuple[trio.CancelScope, list] | None = None

    async def run(self) -> None:
        backoff = 0.05
        try:
            while True:
                parts = self.partitions()
                if not parts:
                    if self.changed is not None:
                        await self.changed().wait()
                    else:
                        await trio.sleep(0.2)
                    continue
                try:
                    await self._truncate_if_needed([p for p in parts if p.needs_truncation])
                    await self._fetch_once([p for p in parts if not p.needs_truncation], parts)
                    backoff = 0.05
                except PeerError as e:
                    log.debug("fetch from node %d failed: %s", self.upstream_id, e)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
        finally:
            await self.conn.aclose()

    def partitions_changed(self) -> None:
        """Metadata changed. A Fetch waiting upstream that does not cover every partition
        this fetcher now follows is given up: the upstream would hold it for up to
        ``wait_ms`` (replica.fetch.wait.max.ms) while a partition just created here waits
        for its first fetch, and an acks=all write to it for this replica. (Kafka's fetcher
        thread lets such a fetch run out.)"""
        if self._in_flight is not None:
            scope, known = self._in_flight
            covered = {(p.topic.name, p.index) for p in known}
            if any((p.topic.name, p.index) not in covered for p in self.partitions()):
                scope.cancel()

    async def _truncate_if_needed(self, parts: list) -> None:
        if not parts:
            return
        by_topic: dict[str, list] = {}
        for p in parts:
            by_topic.setdefault(p.topic.name, []).append(p)
        resp = await self.conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION, {
            "replica_id": self.node_id,
            "topics": [{"topic": t, "partitions": [
                {"partition": p.index, "current_leader_epoch": p.leader_epoch, "leader_epoch": p.latest_epoch()}
                for p in ps]} for t, ps in by_topic.items()]})
        index = {(t["topic"], r["partition"]): r for t in resp["topics"] for r in t["partitions"]}
        for p in parts:
            r = index.get((p.topic.name, p.index))
            if r is None or r["error_code"]:
                continue   # upstream not ready for this epoch yet; try again next round
            target = p.truncation_point(r["leader_epoch"], r["end_offset"])
            if target < p.log.log_end_offset:
                await p.truncate_to(target)
            p.needs_truncation = False

    async def _fetch_once(self, parts: list, known: list) -> None:
        """Fetches ``parts``; ``known`` is every partition this round began with."""
        if not parts:
            await trio.sleep(0.05)
            return
        # Each partition's fetch state as a tuple (leader epoch, log end, last epoch, log
        # start): compared with what the session last sent, and made into request fields
        # only when it changed (a follower of many idle partitions does little per round).
        states = {(p.topic.name, p.index): (p.leader_epoch, p.log.log_end_offset, p.latest_epoch(),
                                            p.log.log_start_offset) for p in parts}
        request = {
            "replica_id": self.node_id, "max_wait_ms": self.wait_ms, "min_bytes": 1,
            "max_bytes": RESPONSE_MAX_BYTES, "isolation_level": 0, "rack_id": "",
            **self.session.build(states, _partition_fields),
        }
        resp = None
        with trio.CancelScope() as scope:
            self._in_flight = (scope, known)
            try:
                resp = await self.conn.request(ApiKey.FETCH, FETCH_VERSION, request, timeout=self.wait_ms / 1000 + 30)
            except PeerError:
                self.session.reset()   # the answer may have been lost after the upstream moved the epoch
                raise
            finally:
                self._in_flight = None
        if resp is None:
            # Given up by partitions_changed: its answer is still to come on this
            # connection, so close it; the next Fetch opens a new session naming them all.
            await self.conn.aclose()
            self.session.reset()
            return
        self.session.on_response(resp.get("error_code", 0), resp.get("session_id", 0))
        if resp.get("error_code"):
            await trio.sleep(0.1)
            return
        index = {(t["topic"], r["partition_index"]): r for t in resp["responses"] for r in t["partitions"]}
        for p in parts:
            key = (p.topic.name, p.index)
            r = index.get(key)
            if r is None:
                continue
            if (p.leader_epoch, p.log.log_end_offset) != states[key][:2] or p.upstream != self.upstream_id:
                # The answer is older than what happened here while it travelled: a new
                # epoch (this replica may lead now and have appended its own batches), or
                # a truncation. Appending it would put the old upstream's batches after
                # them: drop it and fetch again under the new state.
                continue
            await self._apply(p, r)
        if index:
            # Let the tasks this answer woke (downstream replicas' and consumers' long
            # polls, acks=all answers) write their responses before the next Fetch goes
            # upstream: that write may hand this small machine's CPU to the upstream
            # broker, and a hop's p50 rose by ~0.05 ms when it went first.
            await trio.lowlevel.checkpoint()

    async def _apply(self, p, r: dict) -> None:
        err = r["error_code"]
        if err == ErrorCode.OFFSET_OUT_OF_RANGE:
            if p.log.log_end_offset < r["log_start_offset"]:
                # Everything we have is below the upstream's log start (retention or
                # DeleteRecords ran there): start over at its log start.
                await p.truncate_fully_and_start_at(r["log_start_offset"])
            else:
                p.needs_truncation = True   # our log is longer than the upstream's: diverged
            return
        if err:
            return   # epoch fencing / not a replica yet: metadata will catch up
        diverging = r.get("diverging_epoch") or {}
        if diverging.get("end_offset", -1) >= 0:
            # KIP-320: the upstream's log ends epoch `epoch` at `end_offset`, before our
            # fetch offset: our tail past it never existed upstream. Truncate to the
            # earlier of the two ends of that epoch, then fetch again.
            target = p.truncation_point(diverging["epoch"], diverging["end_offset"])
            if target < p.log.log_end_offset:
                await p.truncate_to(target)
            return
        records = r["records"]
        if records:
            try:
                p.append_replicated(records)
            except InvalidRecordBatch as e:
                # Corrupt in transit, or batches that do not continue our log (we hold a
                # tail the upstream does not): reconcile with the upstream, then refetch.
                log.warning("replicated batch for %s-%d from node %d rejected (%s); reconciling",
                            p.topic.name, p.index, self.upstream_id, e)
                p.needs_truncation = True
                return
        if r["log_start_offset"] > p.log.log_start_offset and r["log_start_offset"] <= p.log.log_end_offset:
            p.log.delete_records_before(r["log_start_offset"])
        p.set_follower_high_watermark(r["high_watermark"])
        self.on_appended(p)
