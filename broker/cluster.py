"""The cluster around this broker: metadata log, replication trees, controller duties.

* Every broker replays ``__cluster_metadata`` into a MetadataImage and reconciles its
  local topics with it: which partitions it holds, each one's tree, leader and epoch.
* Non-controllers replicate ``__cluster_metadata`` from the controller like any
  partition, and run one UpstreamFetcher per upstream broker for the partitions whose
  tree makes them a child of that broker.
* The controller (one broker, fixed by configuration) appends the decisions: topics,
  partitions, leaders. It probes every broker and, when a partition's leader has been
  silent for ``leader_failure_timeout_ms``, promotes the live child with the highest log
  end offset (it holds every acknowledged record: acks=all needs the ISR, which is the
  leader's direct children). Controller failover is out of scope: while the controller is
  down, data keeps flowing along the existing trees and metadata changes wait.

A single-node broker (no ``peers``) skips all of this: topics live in the registry only.
"""
from __future__ import annotations

import logging
import uuid

import trio

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import build_batch, iter_records
from replication.client import PeerConnection, PeerError
from replication.fetcher import UpstreamFetcher
from replication.metadata import (METADATA_TOPIC, MetadataImage, TopicImage, decode_event, encode_event,
                                  isr_event, leader_event, topic_event)
from replication.tree import assign_replicas, parent_of, promote

from .broker import now_ms
from .topics import TopicError, validate_topic_name

log = logging.getLogger("canopy.cluster")

PROBE_INTERVAL_S = 0.25


class Cluster:
    def __init__(self, broker):
        self.broker = broker
        self.config = broker.config
        self.node_id = broker.node_id
        self.enabled = self.config.is_cluster
        self.peers = self.config.peer_map if self.enabled else {
            self.node_id: (*self.config.advertised_addr, self.config.rack)}
        self.controller_id = self.config.controller_id
        self.image = MetadataImage()
        self.meta = None                       # the local __cluster_metadata Partition
        self.ready = not self.enabled or self.is_controller
        self._changed = trio.Event()
        self._last_seen: dict[int, int] = {}   # controller: node -> last successful probe
        self._started_ms = now_ms()
        self._peer_conns: dict[int, PeerConnection] = {}

    @property
    def is_controller(self) -> bool:
        return self.node_id == self.controller_id

    # -- startup -------------------------------------------------------------------
    def load(self) -> None:
        if not self.enabled:
            return
        registry = self.broker.topics
        topic = registry.get(METADATA_TOPIC) or registry.create(
            METADATA_TOPIC, 1, {"retention.ms": "-1", "retention.bytes": "-1", "segment.bytes": str(64 << 20)})
        self.meta = topic.partitions[0]
        others = sorted(n for n in self.peers if n != self.controller_id)
        # The metadata log's tree is flat: every broker is a direct child of the controller.
        self.meta.set_assignment([self.controller_id, *others], max(1, len(others)), 0)
        self.meta.needs_truncation = False
        self.meta.authoritative = True
        lg = self.meta.log
        self._replay_from(lg.log_start_offset)
        log.info("cluster: node %d of %s, controller %d, %d topics in the metadata log",
                 self.node_id, sorted(self.peers), self.controller_id, len(self.image.topics))

    def _replay_from(self, offset: int) -> None:
        lg = self.meta.log
        if offset >= lg.log_end_offset:
            return
        with lg.read(offset, 1 << 62) as result:
            data = result.read_bytes()
        for rec in iter_records(data):
            if rec.offset <= self.image.applied_offset:
                continue
            event = decode_event(rec.value or b"")
            if event is None:
                log.warning("skipping unreadable metadata record at offset %d", rec.offset)
                self.image.applied_offset = rec.offset
                continue
            self._apply(rec.offset, event)

    # -- applying decisions --------------------------------------------------------------
    def _apply(self, offset: int, event: dict) -> None:
        touched = self.image.apply(offset, event)
        registry = self.broker.topics
        try:
            if touched is None:
                if event["type"] == "delete_topic" and registry.get(event["name"]) is not None:
                    registry.delete(event["name"])
            else:
                self._reconcile(touched)
        except (TopicError, OSError) as e:
            # This broker cannot host what the controller decided (e.g. out of file
            # descriptors); it stays out of those trees rather than stop replicating.
            log.error("cannot apply metadata record %d (%s %s): %s", offset, event["type"], event["name"], e)
        self._signal()

    def _reconcile(self, t: TopicImage) -> None:
        registry = self.broker.topics
        local = registry.get(t.name)
        if local is not None and local.topic_id != t.topic_id:
            registry.delete(t.name)   # deleted and re-created while we were away
            local = None
        if local is None:
            local = registry.create(t.name, len(t.partitions), dict(t.configs), topic_id=t.topic_id)
        elif len(local.partitions) < len(t.partitions):
            registry.add_partitions(t.name, len(t.partitions))
        for p, pi in zip(local.partitions, t.partitions):
            if p.set_assignment(pi.replicas, t.fanout, pi.leader_epoch):
                role = "leader" if p.is_leader else f"follower of {p.upstream}" if p.is_replica else "not a replica"
                log.info("%s-%d: epoch %d, tree %s, this node is %s", t.name, p.index, pi.leader_epoch,
                         pi.replicas, role)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def changed(self) -> trio.Event:
        return self._changed

    def _append_event(self, event: dict) -> None:
        """Controller only: append a decision to the metadata log and apply it."""
        p = self.meta
        batch = build_batch([(event["type"].encode(), encode_event(event), [], None)])
        result = p.log.append(batch, leader_epoch=p.leader_epoch)
        p.on_leader_append(result.base_offset)
        self.broker.flusher.mark_dirty(p.log)
        self._apply(result.base_offset, event)

    # -- controller operations ---------------------------------------------------------
    def create_topic(self, name: str, num_partitions: int, replication_factor: int, configs: dict,
                     validate_only: bool = False) -> TopicImage | None:
        validate_topic_name(name)
        if name in self.image.topics or name == METADATA_TOPIC:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "number of partitions must be at least 1")
        self.broker.topics.validate_configs(configs)
        self.broker.topics.check_partition_budget(num_partitions)
        rf = replication_factor if replication_factor > 0 else (
            self.config.replication_factor if self.config.replication_factor > 0 else len(self.peers))
        if rf > len(self.peers):
            raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             f"replication factor {rf} with {len(self.peers)} brokers")
        fanout = int(configs.get("replication.fanout", self.config.fanout))
        if validate_only:
            return None
        trees = [assign_replicas(list(self.peers), i, rf, self.controller_id) for i in range(num_partitions)]
        self._append_event(topic_event(name, uuid.uuid4(), dict(configs), fanout, trees))
        return self.image.topics[name]

    def delete_topic(self, name: str) -> None:
        if name not in self.image.topics:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        self._append_event({"type": "delete_topic", "name": name})

    def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        t = self.image.topics.get(name)
        if t is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        if total <= len(t.partitions):
            raise TopicError(ErrorCode.INVALID_PARTITIONS,
                             f"topic {name!r} has {len(t.partitions)} partitions; the count can only grow")
        if validate_only:
            return
        rf = len(t.partitions[0].replicas)
        trees = [assign_replicas(list(self.peers), i, rf, self.controller_id)
                 for i in range(len(t.partitions), total)]
        self._append_event({"type": "add_partitions", "name": name,
                            "partitions": [{"replicas": r, "leader_epoch": 0} for r in trees]})

    def set_tree(self, name: str, partition: int, replicas: list[int]) -> None:
        """A new tree for one partition (promotion); bumps the leader epoch when the
        leader changes, as Kafka does on every leadership change."""
        t = self.image.topics.get(name)
        if t is None or not 0 <= partition < len(t.partitions):
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {name}-{partition}")
        current = t.partitions[partition]
        if sorted(replicas) != sorted(current.replicas):
            raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"replicas {replicas} must be a reordering of {current.replicas}")
        old_leader = current.leader
        epoch = current.leader_epoch + (1 if replicas[0] != old_leader else 0)
        # Kafka's election keeps the ISR minus the replaced leader; the new leader then
        # reports its own as its children fetch.
        isr = [replicas[0], *[n for n in current.isr if n not in (old_leader, replicas[0])]] \
            if replicas[0] != old_leader else current.isr
        self._append_event(leader_event(name, partition, replicas, epoch, isr))
        log.info("controller: %s-%d leader %d -> %d (epoch %d), tree %s", name, partition,
                 old_leader, replicas[0], epoch, replicas)

    # -- forwarding (commands go upstream) -------------------------------------------------
    def peer(self, node: int) -> PeerConnection:
        conn = self._peer_conns.get(node)
        if conn is None:
            host, port, _ = self.peers[node]
            conn = self._peer_conns[node] = PeerConnection(host, port, client_id=f"canopy-{self.node_id}")
        return conn

    async def forward_to_controller(self, key: int, version: int, body: dict, on_error=None) -> dict:
        """Relay a request to the controller. If it is unreachable, ``on_error(message)``
        builds the answer (NOT_CONTROLLER, which clients treat as "retry later")."""
        try:
            return await self.peer(self.controller_id).request(key, version, body, timeout=30)
        except PeerError as e:
            if on_error is None:
                raise
            log.warning("controller %d unreachable: %s", self.controller_id, e)
            return on_error(f"controller {self.controller_id} is unreachable; metadata changes wait for it")

    async def forward_produce(self, partition, records, acks: int, timeout_ms: int, version: int) -> dict:
        upstream = partition.upstream
        out = {"index": partition.index, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER, "base_offset": -1,
               "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [], "error_message": None}
        if upstream is None or not self.ready:
            return out
        try:
            # A fresh connection per forwarded request keeps concurrent producers from
            # queueing behind one another's acks=all waits.
            conn = PeerConnection(*self.peers[upstream][:2], client_id=f"canopy-forward-{self.node_id}")
            try:
                resp = await conn.request(ApiKey.PRODUCE, max(version, 3), {
                    "transactional_id": None, "acks": acks if acks != 0 else 1, "timeout_ms": timeout_ms,
                    "topic_data": [{"name": partition.topic.name,
                                    "partition_data": [{"index": partition.index, "records": records}]}]},
                    timeout=timeout_ms / 1000 + 10)
            finally:
                await conn.aclose()
        except PeerError as e:
            log.info("forwarding produce for %s-%d to node %d failed: %s", partition.topic.name,
                     partition.index, upstream, e)
            return out
        r = resp["responses"][0]["partition_responses"][0]
        return {**out, **{k: r[k] for k in out if k in r}}

    # -- liveness ----------------------------------------------------------------------
    def is_alive(self, node: int) -> bool:
        """Controller's view. A broker never heard from is given a startup grace (brokers
        of a cluster start in any order) before it counts as dead."""
        if node == self.node_id or not self.enabled or not self.is_controller:
            return True   # only the controller probes; others trust the metadata log
        seen = self._last_seen.get(node)
        timeout = self.config.leader_failure_timeout_ms
        if seen is None:
            return now_ms() - self._started_ms <= max(3 * timeout, 10_000)
        return now_ms() - seen <= timeout

    def racks(self) -> dict[int, str | None]:
        return {n: rack for n, (_, _, rack) in self.peers.items()}

    # -- background work ---------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._manage_fetchers)
            nursery.start_soon(self._isr_ticker)
            if self.is_controller:
                nursery.start_soon(self._monitor)
            task_status.started()

    async def _isr_ticker(self) -> None:
        """ISR shrink can let the high watermark advance (a lagging child no longer holds it
        back), so leaders re-evaluate periodically, not only when a fetch arrives; and
        each leader reports ISR changes to the controller, which records them."""
        while True:
            await trio.sleep(0.2)
            ts = now_ms()
            changes: dict[str, list] = {}
            for p in self.broker.topics.all_partitions():
                if not p.is_leader or len(p.replicas) < 2 or p is self.meta:
                    continue
                p.maybe_advance_hw(ts)
                t = self.image.topics.get(p.topic.name)
                if t is None or p.index >= len(t.partitions) or not self.ready:
                    continue
                pi = t.partitions[p.index]
                isr = p.isr(ts)
                if pi.leader_epoch == p.leader_epoch and sorted(isr) != sorted(pi.isr):
                    changes.setdefault(p.topic.name, []).append(
                        {"partition_index": p.index, "leader_epoch": p.leader_epoch, "isr": isr})
            if changes:
                await self._report_isr(changes)

    async def _report_isr(self, changes: dict[str, list]) -> None:
        request = {"broker_id": self.node_id,
                   "topics": [{"name": n, "partitions": ps} for n, ps in changes.items()]}
        if self.is_controller:
            self.alter_isr(request)
            return
        try:
            await self.forward_to_controller(ApiKey.CANOPY_ALTER_ISR, 0, request)
        except PeerError as e:
            log.debug("ISR report to the controller failed: %s", e)

    def alter_isr(self, request: dict) -> dict:
        """Controller: record a leader's ISR (only from the current leader and epoch)."""
        out = []
        for t in request["topics"]:
            parts = []
            img = self.image.topics.get(t["name"])
            for pr in t["partitions"]:
                i = pr["partition_index"]
                err = ErrorCode.NONE
                if img is None or not 0 <= i < len(img.partitions):
                    err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif img.partitions[i].leader != request["broker_id"] or \
                        img.partitions[i].leader_epoch != pr["leader_epoch"]:
                    err = ErrorCode.FENCED_LEADER_EPOCH
                elif sorted(pr["isr"]) != sorted(img.partitions[i].isr):
                    self._append_event(isr_event(t["name"], i, pr["leader_epoch"], list(pr["isr"])))
                    log.info("controller: ISR of %s-%d is now %s", t["name"], i, pr["isr"])
                parts.append({"partition_index": i, "error_code": err})
            out.append({"name": t["name"], "partitions": parts})
        return {"error_code": 0, "topics": out}

    def _partitions_from(self, upstream: int) -> list:
        out = []
        for p in self.broker.topics.all_partitions():
            if p.is_replica and not p.is_leader and p.upstream == upstream:
                if p is not self.meta and not self.ready:
                    continue   # follow data trees only once our metadata is current
                out.append(p)
        return out

    def _on_appended(self, partition) -> None:
        if partition is self.meta:
            self._replay_from(self.image.applied_offset + 1)
            if not self.ready and partition.high_watermark >= partition.log.log_end_offset:
                self.ready = True
                log.info("cluster: metadata caught up at offset %d", partition.log.log_end_offset)
                self._signal()

    async def _manage_fetchers(self) -> None:
        running: dict[int, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            while True:
                wanted = {p.upstream for p in self.broker.topics.all_partitions()
                          if p.is_replica and not p.is_leader and p.upstream is not None}
                for node in list(running):
                    if node not in wanted:
                        running.pop(node).cancel()
                for node in wanted - set(running):
                    running[node] = await nursery.start(self._run_fetcher, node)
                await self._changed.wait()

    async def _run_fetcher(self, node: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            host, port, _ = self.peers[node]

            fetcher = UpstreamFetcher(self.node_id, node, (host, port), lambda: self._partitions_from(node),
                                      self._on_appended, wait_ms=self.config.replica_fetch_wait_ms, changed=self.changed)
            await fetcher.run()

    async def _monitor(self) -> None:
        """Controller: probe every broker; promote away from leaders that went silent."""
        async def probe(node: int) -> None:
            conn = PeerConnection(*self.peers[node][:2], client_id=f"canopy-controller-{self.node_id}",
                                  connect_timeout=1.0)
            while True:
                try:
                    await conn.request(ApiKey.API_VERSIONS, 0, {}, timeout=1.0)
                    self._last_seen[node] = now_ms()
                except PeerError:
                    pass
                await trio.sleep(PROBE_INTERVAL_S)

        self._started_ms = now_ms()
        async with trio.open_nursery() as nursery:
            for node in self.peers:
                if node != self.node_id:
                    nursery.start_soon(probe, node)
            while True:
                await trio.sleep(PROBE_INTERVAL_S)
                for name, t in list(self.image.topics.items()):
                    for i, p in enumerate(t.partitions):
                        if not self.is_alive(p.leader):
                            await self._fail_over(name, i, p.replicas, t.fanout)
                        elif p.leader == self.node_id:
                            self._hand_off(name, i, p, t.fanout)

    async def _fail_over(self, name: str, index: int, replicas: list[int], fanout: int) -> None:
        dead = replicas[0]
        isr = self.image.topics[name].partitions[index].isr
        children = [n for n in replicas[1:] if parent_of(replicas, n, fanout) == dead and self.is_alive(n)]
        # An in-sync child holds every acknowledged record (acks=all waited for the ISR);
        # failing that, any live child, then any live replica (an unclean election).
        candidates = [n for n in children if n in isr] or children or [n for n in replicas[1:] if self.is_alive(n)]
        # The controller leads only as a last resort: a failure of it would stop failover.
        candidates = [n for n in candidates if n != self.node_id] or candidates
        if not candidates:
            return
        best, best_leo = None, -1
        for node in candidates:
            leo = await self._log_end_offset(node, name, index)
            if leo is not None and leo > best_leo:
                best, best_leo = node, leo
        if best is None:
            return
        log.warning("controller: leader %d of %s-%d silent for %d ms; promoting %d (log end %d)",
                    dead, name, index, self.config.leader_failure_timeout_ms, best, best_leo)
        self.set_tree(name, index, promote(replicas, best, demoted=dead))

    def _hand_off(self, name: str, index: int, p, fanout: int) -> None:
        """The controller leads a partition only until an in-sync child can take over (as
        Kafka's preferred-leader election moves leadership back): a failure of the
        controller would leave that partition without failover."""
        local = self.broker.topics.partition(name, index)
        if local is None or not local.is_leader:
            return
        ts = now_ms()
        for child in local.isr(ts)[1:]:
            st = local.replica_states.get(child)
            if self.is_alive(child) and st is not None and st.log_end_offset >= local.log.log_end_offset:
                log.info("controller: handing leadership of %s-%d to in-sync child %d", name, index, child)
                self.set_tree(name, index, promote(p.replicas, child, demoted=self.node_id))
                return

    async def _log_end_offset(self, node: int, topic: str, partition: int) -> int | None:
        if node == self.node_id:
            local = self.broker.topics.partition(topic, partition)
            return local.log.log_end_offset if local is not None else None
        try:
            # replica_id -2 (Kafka's debugging consumer) asks for the log end offset rather
            # than the high watermark, from any replica.
            resp = await self.peer(node).request(ApiKey.LIST_OFFSETS, 7, {
                "replica_id": -2, "isolation_level": 0,
                "topics": [{"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1,
                                                           "current_leader_epoch": -1}]}]}, timeout=2.0)
        except PeerError:
            return None
        r = resp["topics"][0]["partitions"][0]
        return r["offset"] if r["error_code"] == 0 else None
