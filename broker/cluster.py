"""This broker's part in a cluster whose metadata lives in etcd (controller/image.py).

broker/ only wires things together here:

* At start the broker reads every key under /canopy/ (a one-line error and exit 2 when
  etcd cannot be reached), then **watches** them: each change is applied to the
  ClusterImage and reconciled with the local topics (which partitions this broker holds,
  each one's tree, leader epoch and committed ISR).
* It **registers** under a leased key and keeps the lease alive; a broker whose lease
  lapses is dead to the cluster and its partitions get new leaders.
* It **campaigns** for the controller role (controller/controller.py).
* It runs one UpstreamFetcher per upstream broker for the partitions whose tree makes it
  a child of that broker, and, as a leader, proposes ISR changes by compare-and-swap on
  the partition's key (Kafka's AlterPartition); only the ISR etcd holds counts.
* It allocates producer ids in blocks reserved through etcd, unique in the cluster.

Losing etcd never stops the data path: leaders keep serving produce and fetch on the state
they have, followers keep fetching, and whatever needs etcd (metadata changes, elections,
ISR changes, new producer-id blocks) waits and is retried with backoff.

A single broker with no ``metadata-store`` skips all of this: topics live in the registry.
"""
from __future__ import annotations

import json
import logging
import math
import uuid
from pathlib import Path

import trio

from controller.controller import Controller, ControllerError
from controller.etcd import Compare, EtcdClient, EtcdError, EtcdUnavailable, Op, WatchCompacted, parse_endpoints
from controller.image import (CLUSTER_KEY, DEFAULT_BROKER_CONFIGS, PREFIX, PRODUCER_ID_BLOCK_KEY, ClusterImage,
                              PartitionImage, TopicImage, broker_key, broker_registration, encode, partition_key)
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from replication.client import PeerConnection, PeerError
from replication.fetcher import UpstreamFetcher
from storage import replace_durably

from .broker import monotonic_ms
from .groups.offsets_log import OFFSETS_TOPIC, offsets_topic_configs
from .topics import INTERNAL_TOPICS, TopicError, validate_topic_name

log = logging.getLogger("canopy.cluster")

PRODUCER_ID_BLOCK = 1000   # Kafka's AllocateProducerIds hands out blocks of 1000 too
ISR_TICK_S = 0.2
CONTROLLER_CALL_RETRY_S = 8.0   # how long an admin request waits for an unanswering etcd


class StoreUnavailable(Exception):
    """etcd could not be reached at start (the CLI prints it and exits 2)."""


class Cluster:
    def __init__(self, broker):
        self.broker = broker
        self.config = broker.config
        self.node_id = broker.node_id
        self.enabled = bool(self.config.metadata_store)
        self.image = ClusterImage()
        self.lease_id = 0
        self.registered_revision = 0   # create revision of our broker key; 0 until registered
        # etcd leases count whole seconds.
        self.lease_ttl_s = max(1, math.ceil(self.config.leader_failure_timeout_ms / 1000))
        # A call tries each endpoint in turn: keep one attempt well inside the lease TTL, so
        # a frozen or leaderless member cannot make a lease renewal miss it.
        self.store = EtcdClient(parse_endpoints(self.config.metadata_store),
                                request_timeout=max(0.5, self.lease_ttl_s / 4)) if self.enabled else None
        self.controller = Controller(self)
        self.ready = not self.enabled
        self.started_at = 0.0   # trio clock at connect()
        self._changed = trio.Event()
        self._registered = trio.Event()
        self._peer_conns: dict[int, PeerConnection] = {}
        self._fetchers: dict[int, UpstreamFetcher] = {}   # upstream node id -> its current fetcher
        self._pid_lock = trio.Lock()
        self._pid_next = self._pid_end = 0

    # -- what handlers ask -------------------------------------------------------------
    @property
    def controller_id(self) -> int:
        return self.image.controller_id if self.enabled else self.node_id

    async def elected_controller(self) -> int:
        """The controller's node id for a client (Metadata, DescribeCluster) or a forwarded
        request, waiting up to one lease TTL while none is elected: between a broker's
        start and the first election (or a dead controller's lease expiring and the next
        election) there is none. librdkafka's admin client, told controller -1, refreshes
        metadata once and then waits for a broker state change that never comes, so a
        CreateTopics sent right after the cluster starts would hang until its timeout.
        An election takes milliseconds once the key is free; -1 after the wait means none
        could be elected (etcd unreachable, for one)."""
        if self.enabled and self.image.controller_id < 0:
            with trio.move_on_after(self.lease_ttl_s):
                while self.image.controller_id < 0:
                    await self._changed.wait()
        return self.controller_id

    @property
    def is_controller(self) -> bool:
        return not self.enabled or self.controller.active

    def brokers(self, listener: str | None = None) -> list[dict]:
        """Registered (live) brokers, as Metadata and DescribeCluster report them: their
        endpoints on ``listener`` (the one the request arrived on; None = inter-broker).
        As in Kafka, a broker without that listener is left out: its address on another
        listener is one this client may not be able to reach."""
        if not self.enabled:
            lc = self.config.listener_config
            host, port = lc.advertised.get(listener or lc.inter_broker, lc.inter_broker_address)
            return [{"node_id": self.node_id, "host": host, "port": port, "rack": self.config.rack}]
        out = []
        for _, b in sorted(self.image.brokers.items()):
            addr = b.address(listener)
            if addr is not None:
                out.append({"node_id": b.node_id, "host": addr[0], "port": addr[1], "rack": b.rack})
        return out

    def racks(self) -> dict[int, str | None]:
        if not self.enabled:
            return {self.node_id: self.config.rack}
        return {n: b.rack for n, b in self.image.brokers.items()}

    def is_alive(self, node: int) -> bool:
        return not self.enabled or node in self.image.brokers

    def unclean_election_enabled(self, topic: str) -> bool:
        t = self.image.topics.get(topic)
        # The topic's override, else the broker's (possibly dynamic) default.
        return self.broker.topics.resolve(t.configs if t is not None else {},
                                          "unclean.leader.election.enable").value.lower() == "true"

    def validate_new_topic(self, name: str) -> None:
        validate_topic_name(name)
        if name in INTERNAL_TOPICS:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"{name!r} is an internal topic")

    def offsets_topic_spec(self) -> tuple[str, int, int, dict[str, str]]:
        """(name, partitions, replication factor, configs) of __consumer_offsets."""
        rf = self.config.offsets_topic_replication_factor
        return OFFSETS_TOPIC, self.config.offsets_topic_num_partitions, rf, offsets_topic_configs(rf, self.config.offsets_topic_segment_bytes)

    def changed(self) -> trio.Event:
        return self._changed

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_registered(self) -> None:
        await self._registered.wait()

    async def wait_revision(self, revision: int, timeout_s: float = 10.0) -> bool:
        """Wait until this broker's image has applied ``revision`` (a write's answer then
        reflects it, e.g. a created topic is in the next Metadata)."""
        with trio.move_on_after(timeout_s):
            while self.image.revision < revision:
                await self._changed.wait()
            return True
        return False

    # -- start: read everything, then watch ------------------------------------------------
    async def connect(self) -> None:
        if not self.enabled:
            return
        try:
            kvs, revision = await self.store.get_prefix(PREFIX)
            if not any(kv.key == CLUSTER_KEY for kv in kvs):
                self._check_cluster_identity(None)
                await self.store.txn([Compare.create_revision(CLUSTER_KEY, "=", 0)],
                                     [Op.put(CLUSTER_KEY, encode({"id": str(uuid.uuid4())}))])
                kvs, revision = await self.store.get_prefix(PREFIX)
        except EtcdError as e:
            raise StoreUnavailable(f"metadata store {self.config.metadata_store} is unreachable: {e}") from None
        ident = next(json.loads(kv.value)["id"] for kv in kvs if kv.key == CLUSTER_KEY)
        self._check_cluster_identity(ident)
        self._load(kvs, revision)
        self.started_at = trio.current_time()
        log.info("cluster: node %d, metadata from etcd at revision %d: %d topic(s), %d live broker(s), "
                 "controller %d", self.node_id, revision, len(self.image.topics), len(self.image.brokers),
                 self.image.controller_id)

    def _load(self, kvs, revision: int) -> None:
        image = ClusterImage()
        for kv in kvs:
            image.apply(kv.key, kv.value, kv.mod_revision, kv.create_revision)
        image.revision = revision
        self._report_unreadable(image)
        self.image = image
        self._apply_broker_configs()
        registry = self.broker.topics
        for name in [n for n in registry.topics if n not in image.topics]:
            log.info("topic %s is not in the cluster metadata (deleted while this broker was away); removing it", name)
            self._delete_local(name)
        for t in image.topics.values():
            self._reconcile(t)
        self.ready = True
        self._signal()

    def _check_cluster_identity(self, store_id: str | None) -> None:
        """Refuse to start rather than let the metadata store delete local data that is not
        its own: the store decides which topics exist, so a broker pointed at another
        cluster's etcd (or a wiped one), or a single broker's data directory joining a
        cluster, would otherwise lose its topics (Kafka refuses a mismatched cluster.id in
        meta.properties for the same reason)."""
        path = Path(self.config.data_dir) / "cluster.json"
        try:
            local = json.loads(path.read_text())["id"]
        except FileNotFoundError:
            local = None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreUnavailable(f"{path} is damaged ({e}); remove it only if this data directory "
                                   f"belongs to the cluster in {self.config.metadata_store}") from None
        if local is not None and local != store_id:
            raise StoreUnavailable(f"data directory {self.config.data_dir} belongs to cluster {local}, but the "
                                   f"metadata store {self.config.metadata_store} holds "
                                   f"{'cluster ' + store_id if store_id else 'no cluster'}")
        if local is None:
            own = [n for n in self.broker.topics.topics if n not in INTERNAL_TOPICS]
            if own:
                raise StoreUnavailable(f"data directory {self.config.data_dir} holds topics of a broker outside any "
                                       f"cluster ({', '.join(sorted(own)[:3])}...); a cluster member starts from an "
                                       "empty data directory")
            if store_id is not None:
                replace_durably(path, json.dumps({"id": store_id}))

    def _report_unreadable(self, image: ClusterImage) -> None:
        for key in image.unreadable:
            log.error("cluster metadata key %s has a value this broker cannot read; ignoring it", key)
        image.unreadable.clear()

    def _apply_events(self, events) -> None:
        touched: set[str] = set()
        for ev in events:
            name = self.image.apply(ev.kv.key, ev.kv.value if ev.type == "PUT" else None,
                                    ev.kv.mod_revision, ev.kv.create_revision)
            self.image.revision = max(self.image.revision, ev.kv.mod_revision)
            if name:
                touched.add(name)
        self._report_unreadable(self.image)
        self._apply_broker_configs()
        registry = self.broker.topics
        for name in touched:
            t = self.image.topics.get(name)
            if t is not None:
                self._reconcile(t)
            elif registry.get(name) is not None and not self.image.knows_topic(name):
                self._delete_local(name)
        self._signal()

    def _apply_broker_configs(self) -> None:
        """Dynamic broker configs (AlterConfigs on a BROKER resource) live in etcd; every
        broker applies the cluster default and its own at once, as Kafka's brokers apply
        the controller's config records."""
        bc = self.image.broker_configs
        self.broker.topics.set_dynamic_broker_configs(bc.get(DEFAULT_BROKER_CONFIGS, {}),
                                                      bc.get(str(self.node_id), {}))

    def _delete_local(self, name: str) -> None:
        topic = self.broker.topics.get(name)
        if topic is None:
            return
        for p in topic.partitions:
            self.broker.groups.on_partition_change(p, lost=True)
        try:
            self.broker.topics.delete(name)
        except (TopicError, OSError) as e:
            log.error("cannot delete local topic %s: %s", name, e)

    def _reconcile(self, t: TopicImage) -> None:
        registry = self.broker.topics
        try:
            local = registry.get(t.name)
            if local is not None and local.rebuilt:
                # Its topic.json was damaged and rebuilt with a made-up id: the cluster's
                # id and configs are the real ones, and its logs are this topic's.
                registry.adopt(local, t.topic_id, dict(t.configs))
            if local is not None and local.topic_id != t.topic_id:
                self._delete_local(t.name)   # deleted and re-created while we were away
                local = None
            if local is None:
                local = registry.create(t.name, len(t.partitions), dict(t.configs), topic_id=t.topic_id)
            elif len(local.partitions) < len(t.partitions):
                registry.add_partitions(t.name, len(t.partitions))
            if local.configs != t.configs:
                # AlterConfigs on any broker: the controller wrote the topic key; every
                # broker applies the new configs at once (retention, max.message.bytes,
                # min.insync.replicas... take effect without a restart, as in Kafka).
                registry.set_configs(local, dict(t.configs))
        except (TopicError, OSError) as e:
            # This broker cannot host what the controller decided (e.g. out of file
            # descriptors); it stays out of those trees rather than stop replicating.
            log.error("cannot host topic %s as the cluster metadata says: %s", t.name, e)
            return
        for p, pi in zip(local.partitions, t.partitions):
            was_leader = p.is_leader
            old_isr, old_epoch = set(p.committed_isr), p.leader_epoch
            fenced = pi.leader == self.node_id and (not self.registered_revision
                                                    or pi.mod_revision < self.registered_revision)
            if p.set_assignment(pi.replicas, t.fanout, pi.leader_epoch, pi.isr, fenced=fenced):
                role = ("leader" if p.is_leader else "a former leader, fenced until the controller decides"
                        if p.fenced else f"follower of {p.upstream}" if p.is_replica else "not a replica")
                log.info("%s-%d: epoch %d, tree %s, isr %s, this node is %s", t.name, p.index, pi.leader_epoch,
                         pi.replicas, pi.isr, role)
            if was_leader and p.is_leader and pi.leader_epoch == old_epoch:
                # Kafka's IsrShrinksPerSec / IsrExpandsPerSec, counted by the leader for
                # every committed change: its own proposals and the controller's removal
                # of a dead broker alike.
                if old_isr - set(pi.isr):
                    self.broker.stats.isr_shrinks += 1
                if set(pi.isr) - old_isr:
                    self.broker.stats.isr_expands += 1
            if was_leader != p.is_leader or p.is_leader:
                self.broker.groups.on_partition_change(p, lost=not p.is_leader)

    # -- background work ---------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._contained, "metadata watch", self._watch)
            nursery.start_soon(self._contained, "registration", self._keep_registered)
            nursery.start_soon(self._contained, "controller", self.controller.run)
            nursery.start_soon(self._contained, "fetcher manager", self._manage_fetchers)
            nursery.start_soon(self._contained, "ISR ticker", self._isr_ticker)
            task_status.started()

    async def _contained(self, what: str, fn) -> None:
        """A background duty that fails is logged and restarted after a pause; it never
        takes the broker down (a crash loop under compose's restart policy would)."""
        while True:
            try:
                await fn()
                return
            except Exception:
                log.exception("cluster: %s failed; restarting it in 1 s", what)
                await trio.sleep(1.0)

    async def _watch(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with self.store.watch(PREFIX, self.image.revision + 1) as stream:
                    backoff = 0.1
                    async for events in stream:
                        self._apply_events(events)
            except WatchCompacted:
                log.warning("cluster: watch revision compacted in etcd; reloading the metadata")
                try:
                    kvs, revision = await self.store.get_prefix(PREFIX)
                    self._load(kvs, revision)
                except EtcdError as e:
                    log.warning("cluster: reload failed (%s); retrying", e)
                    await trio.sleep(backoff)
            except EtcdError as e:
                log.warning("cluster: metadata watch interrupted (%s); data keeps flowing, metadata changes "
                            "wait; re-watching from revision %d in %.1f s", e, self.image.revision + 1, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _keep_registered(self) -> None:
        backoff = 0.1
        me = broker_key(self.node_id)
        host, port = self.config.advertised_addr   # the inter-broker listener's
        value = encode(broker_registration(host, port, self.config.rack, self.config.listener_config.advertised,
                                           self.config.http_advertised))
        while True:
            try:
                if not self.lease_id:
                    lease = await self.store.lease_grant(self.lease_ttl_s)
                    r = await self.store.txn([Compare.create_revision(me, "=", 0)], [Op.put(me, value, lease=lease)])
                    if not r.succeeded:
                        # Our previous incarnation (kill -9 and a quick restart) or another
                        # broker with our node id: wait for that lease to lapse.
                        await self.store.lease_revoke(lease)
                        log.warning("cluster: node id %d is still registered (a previous run of this broker, "
                                    "or another broker with the same node-id); waiting for its lease to expire",
                                    self.node_id)
                        await trio.sleep(1.0)
                        continue
                    self.lease_id = lease
                    self.registered_revision = r.revision
                    self._registered.set()
                    # Leaderships recorded before this registration belong to an earlier
                    # run of this broker: fenced until the controller decides again.
                    for t in self.image.topics.values():
                        self._reconcile(t)
                    self._signal()
                    log.info("cluster: registered as node %d (%s:%d) with a %d s lease", self.node_id, host, port,
                             self.lease_ttl_s)
                ttl = await self.store.lease_keepalive(self.lease_id)
                if ttl <= 0:
                    log.warning("cluster: our registration lease expired (paused or cut off from etcd for longer "
                                "than %d s); registering again", self.lease_ttl_s)
                    self.lease_id = 0
                    self.registered_revision = 0
                    self._registered = trio.Event()
                    continue
                backoff = 0.1
                await trio.sleep(self.lease_ttl_s / 3)
            except EtcdError as e:
                log.warning("cluster: cannot renew the registration lease (%s); retrying in %.1f s", e, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # -- ISR changes proposed by leaders (AlterPartition) ------------------------------
    async def _isr_ticker(self) -> None:
        while True:
            await trio.sleep(ISR_TICK_S)
            now = monotonic_ms()
            for p in list(self.broker.topics.all_partitions()):
                if not p.is_leader or len(p.replicas) < 2:
                    continue
                pi = self.image.partition(p.topic.name, p.index)
                if pi is None or pi.leader != self.node_id or pi.leader_epoch != p.leader_epoch:
                    continue
                proposed = p.proposed_isr(now)
                if set(proposed) != set(pi.isr):
                    await self._propose_isr(p.topic.name, p.index, pi, proposed)

    async def _propose_isr(self, topic: str, index: int, pi: PartitionImage, isr: list[int]) -> None:
        key = partition_key(topic, index)
        new = PartitionImage(pi.replicas, pi.leader_epoch, isr, pi.mod_revision)
        try:
            r = await self.store.txn([Compare.mod_revision(key, "=", pi.mod_revision)],
                                     [Op.put(key, new.to_value(self.image.controller_epoch))])
        except EtcdError as e:
            log.warning("ISR change of %s-%d to %s waits: etcd unavailable (%s)", topic, index, isr, e)
            await trio.sleep(0.5)
            return
        if r.succeeded:
            log.info("ISR of %s-%d: %s -> %s (leader epoch %d)", topic, index, pi.isr, isr, pi.leader_epoch)
        # else: the partition changed meanwhile (an election, say); the watch brings it.

    # -- producer ids -------------------------------------------------------------------
    async def allocate_producer_id(self) -> int:
        if not self.enabled:
            return self.broker.producer_ids.allocate()
        async with self._pid_lock:
            if self._pid_next >= self._pid_end:
                await self._reserve_producer_id_block()
            pid = self._pid_next
            self._pid_next += 1
            return pid

    async def _reserve_producer_id_block(self) -> None:
        key = PRODUCER_ID_BLOCK_KEY
        while True:
            kv = await self.store.get(key)
            start = int(json.loads(kv.value)["next"]) if kv is not None else 0
            guard = Compare.mod_revision(key, "=", kv.mod_revision) if kv is not None else \
                Compare.create_revision(key, "=", 0)
            r = await self.store.txn([guard], [Op.put(key, encode({"next": start + PRODUCER_ID_BLOCK}))])
            if r.succeeded:
                self._pid_next, self._pid_end = start, start + PRODUCER_ID_BLOCK
                log.info("producer ids %d..%d reserved for this broker", start, start + PRODUCER_ID_BLOCK - 1)
                return

    # -- forwarding (commands go upstream) -------------------------------------------------
    def _address(self, node: int) -> tuple[str, int] | None:
        b = self.image.brokers.get(node)
        return (b.host, b.port) if b is not None else None

    def peer(self, node: int) -> PeerConnection:
        addr = self._address(node)
        if addr is None:
            raise PeerError(f"node {node} is not registered")
        conn = self._peer_conns.get(node)
        if conn is None or (conn.host, conn.port) != addr:
            conn = self._peer_conns[node] = PeerConnection(*addr, client_id=f"canopy-{self.node_id}",
                                                           security=self.config.inter_broker_security)
        return conn

    async def forward_to_controller(self, key: int, version: int, body: dict, on_error=None) -> dict:
        """Relay a request to the controller. If there is none or it is unreachable,
        ``on_error(message)`` builds the answer (NOT_CONTROLLER: clients retry later)."""
        controller = await self.elected_controller()
        try:
            if controller < 0:
                raise PeerError("no controller is elected")
            return await self.peer(controller).request(key, version, body, timeout=30)
        except PeerError as e:
            if on_error is None:
                raise
            log.warning("controller %d unreachable: %s", controller, e)
            return on_error(f"controller {controller} is unreachable; metadata changes wait for it")

    async def controller_call(self, fn, *args, **kwargs):
        """Run a controller operation; TopicError/ControllerError both carry a Kafka code.
        An etcd that does not answer (a member lost, an election under way) is retried for
        a while: losing one member of three should be at most a brief pause. A write that
        timed out may still have been applied; the retry then meets its guard (e.g.
        TOPIC_ALREADY_EXISTS), as a client retrying against Kafka can."""
        deadline = trio.current_time() + CONTROLLER_CALL_RETRY_S
        while True:
            try:
                return await fn(*args, **kwargs)
            except ControllerError as e:
                raise TopicError(e.code, str(e)) from None
            except EtcdUnavailable as e:
                if trio.current_time() >= deadline:
                    raise TopicError(ErrorCode.REQUEST_TIMED_OUT, f"metadata store unavailable: {e}") from None
                await trio.sleep(0.25)
            except EtcdError as e:
                raise TopicError(ErrorCode.REQUEST_TIMED_OUT, f"metadata store error: {e}") from None

    async def forward_produce(self, partition, records, acks: int, timeout_ms: int, version: int) -> dict:
        upstream = partition.upstream
        out = {"index": partition.index, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER, "base_offset": -1,
               "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [], "error_message": None}
        addr = self._address(upstream) if upstream is not None else None
        if addr is None or not self.ready:
            return out
        try:
            # A fresh connection per forwarded request keeps concurrent producers from
            # queueing behind one another's acks=all waits.
            conn = PeerConnection(*addr, client_id=f"canopy-forward-{self.node_id}",
                                  security=self.config.inter_broker_security)
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

    # -- followers ------------------------------------------------------------------------
    def _partitions_from(self, upstream: int) -> list:
        if not self.ready:
            return []   # follow trees only once our metadata is current
        return [p for p in self.broker.topics.all_partitions()
                if p.is_replica and not p.is_leader and p.upstream == upstream]

    async def _manage_fetchers(self) -> None:
        running: dict[int, tuple[tuple[str, int], trio.CancelScope]] = {}
        async with trio.open_nursery() as nursery:
            while True:
                # Take the event before reading the partitions: starting a fetcher below
                # yields, and a change signalled meanwhile (a topic created right after
                # another) replaces self._changed; waiting on the replacement would miss
                # it, and that replica would never fetch until the next metadata change.
                changed = self._changed
                wanted = {}
                for p in self.broker.topics.all_partitions():
                    if p.is_replica and not p.is_leader and p.upstream is not None:
                        addr = self._address(p.upstream)
                        if addr is not None:   # an unregistered upstream is dead: nothing to fetch from
                            wanted[p.upstream] = addr
                for node in list(running):
                    if running[node][0] != wanted.get(node):
                        running.pop(node)[1].cancel()
                for node in wanted.keys() - running.keys():
                    running[node] = (wanted[node], await nursery.start(self._run_fetcher, node, wanted[node]))
                for node in running:
                    if (fetcher := self._fetchers.get(node)) is not None:
                        fetcher.partitions_changed()   # a new partition is fetched at once
                await changed.wait()

    async def _run_fetcher(self, node: int, addr: tuple[str, int], task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                fetcher = self._fetchers[node] = UpstreamFetcher(
                    self.node_id, node, addr, lambda: self._partitions_from(node), lambda p: None,
                    wait_ms=self.config.replica_fetch_wait_ms, changed=self.changed,
                    security=self.config.inter_broker_security)
                try:
                    await fetcher.run()
                    return
                except Exception:
                    # A full disk or a storage error on one partition must not stop the
                    # broker (defect 7 of issue 10): log, back off, fetch again.
                    log.exception("fetcher from node %d failed; restarting it in 1 s", node)
                    await trio.sleep(1.0)
                finally:
                    # (a fetcher for a new address of this upstream may already be running)
                    if self._fetchers.get(node) is fetcher:
                        del self._fetchers[node]

    async def aclose(self) -> None:
        for conn in self._peer_conns.values():
            await conn.aclose()
        if self.store is not None:
            await self.store.aclose()
