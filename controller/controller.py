"""The controller: one broker at a time, elected through etcd, fenced by etcd.

Every broker campaigns by creating ``/canopy/controller`` with its own broker lease, in a
transaction that succeeds only if the key does not exist. The winner's key revision is the
**controller epoch**; the key disappears with the winner's lease (its broker died, paused
or was cut off from etcd for longer than the lease TTL), and the others campaign again.

Every write the controller makes is a transaction that also compares the controller key's
create revision with its own epoch (Kafka learned this in KAFKA-6082: a controller that
was paused and replaced must not be able to change anything). When that comparison fails,
the controller steps down; nothing it decided after losing the key can reach a broker,
because brokers apply only what etcd holds.

Duties while active: topic creation, deletion and growth, new trees (promotions),
elections when a partition leader's registration disappears, removing dead replicas from
ISRs (controller/decisions.py decides; this module writes), and creating
``__consumer_offsets`` once enough brokers are registered.
"""
from __future__ import annotations

import logging
import uuid

import trio

from protocol.errors import ErrorCode
from replication.replica_state import choose_leader
from replication.tree import assign_replicas, children_of, preferred_leader, promote

from .decisions import changes_for_liveness, reassign
from .etcd import Compare, EtcdError, Op
from .image import (CONTROLLER_KEY, PARTITIONS, PartitionImage, TopicImage, broker_configs_key, encode,
                    partition_key, topic_key)

log = logging.getLogger("canopy.controller")


def _new_partition(live: list[int], index: int, replication_factor: int, fanout: int) -> PartitionImage:
    """A new partition's tree; its ISR starts as the leader and its direct children (the
    only replicas that fetch from the leader: deeper tiers never hold the HW back)."""
    tree = assign_replicas(live, index, replication_factor)
    return PartitionImage(tree, 0, [tree[0], *children_of(tree, tree[0], fanout)])


class ControllerError(Exception):
    """A request the controller refuses; ``code`` is the Kafka error to answer."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class NotController(ControllerError):
    def __init__(self, message: str = "this broker is not the controller"):
        super().__init__(ErrorCode.NOT_CONTROLLER, message)


# Operations per etcd transaction: below etcd's default --max-txn-ops (128).
TXN_OPS = 100


class Controller:
    def __init__(self, cluster):
        self.cluster = cluster          # broker/cluster.py: store, image, lease, config
        self.node_id = cluster.node_id
        self.epoch = -1                 # create revision of our controller key, -1 when not held
        self._offline_reported: set[tuple[str, int]] = set()
        # Topic creation and growth may take several transactions (TXN_OPS below): one at
        # a time, so two CreateTopics of one name never interleave their partition keys.
        self._topic_changes = trio.Lock()

    @property
    def active(self) -> bool:
        img = self.cluster.image
        return self.epoch >= 0 and img.controller_id == self.node_id and img.controller_epoch == self.epoch

    # -- campaign ------------------------------------------------------------------
    async def run(self) -> None:
        backoff = 0.1
        while True:
            await self.cluster.wait_registered()
            if self.cluster.image.controller_id == -1:
                try:
                    r = await self.cluster.store.txn(
                        [Compare.create_revision(CONTROLLER_KEY, "=", 0)],
                        [Op.put(CONTROLLER_KEY, encode({"node_id": self.node_id}), lease=self.cluster.lease_id)])
                    backoff = 0.1
                except EtcdError as e:
                    log.warning("controller campaign: etcd unavailable (%s); retrying", e)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                if r.succeeded:
                    self.epoch = r.revision
                    await self.cluster.wait_revision(r.revision)
                    log.info("node %d is the controller (epoch %d)", self.node_id, self.epoch)
                    try:
                        await self._lead()
                    finally:
                        log.warning("node %d is no longer the controller (epoch %d)", self.node_id, self.epoch)
                        self.epoch = -1
                    continue
            with trio.move_on_after(1.0):
                await self.cluster.changed().wait()

    async def _lead(self) -> None:
        # In a cluster that is starting, a broker whose registration is not there yet may
        # still be on its way (brokers start in any order), so a controller elected soon
        # after its own start waits one lease TTL before electing away from absent
        # leaders. A controller taking over a running cluster needs no grace: live
        # brokers' leases outlive the old controller.
        grace_until = self.cluster.started_at + self.cluster.lease_ttl_s
        self._offline_reported.clear()
        while self.active:
            try:
                if trio.current_time() >= grace_until:
                    await self._elect()
                await self._ensure_offsets_topic()
            except NotController:
                return
            except EtcdError as e:
                log.warning("controller: etcd unavailable (%s); decisions wait", e)
                await trio.sleep(0.5)
            with trio.move_on_after(0.5):
                await self.cluster.changed().wait()

    # -- guarded writes ------------------------------------------------------------
    async def _write(self, compares: list, ops: list) -> int | None:
        """A transaction guarded by our controller epoch. Returns the revision, None when
        one of ``compares`` failed; raises NotController when the guard failed."""
        if not self.active:
            raise NotController()
        guard = Compare.create_revision(CONTROLLER_KEY, "=", self.epoch)
        r = await self.cluster.store.txn([guard, *compares], ops, [Op.get(CONTROLLER_KEY)])
        if r.succeeded:
            await self.cluster.wait_revision(r.revision)
            return r.revision
        current = r.responses[0] if r.responses else []
        if not current or current[0].create_revision != self.epoch:
            log.warning("controller: etcd refused a write of epoch %d: the controller key is gone or newer",
                        self.epoch)
            self.epoch = -1
            raise NotController("this broker lost the controller role")
        return None

    async def _write_partition(self, topic: str, index: int, old: PartitionImage, new: PartitionImage) -> bool:
        key = partition_key(topic, index)
        return await self._write([Compare.mod_revision(key, "=", old.mod_revision)],
                                 [Op.put(key, new.to_value(self.epoch))]) is not None

    # -- elections -----------------------------------------------------------------------
    async def _elect(self) -> None:
        img = self.cluster.image
        changes, offline = changes_for_liveness(img, set(img.brokers), self.cluster.unclean_election_enabled)
        for c in changes:
            if await self._write_partition(c.topic, c.index, c.old, c.new):
                if c.new.leader != c.old.leader:
                    # Kafka's ControllerStats LeaderElectionRateAndTimeMs / UncleanLeaderElectionsPerSec
                    stats = self.cluster.broker.stats
                    stats.leader_elections += 1
                    if c.new.leader not in c.old.isr:
                        stats.unclean_leader_elections += 1
                log.warning("controller: %s-%d %s: leader %d -> %d (epoch %d), tree %s, isr %s", c.topic, c.index,
                            c.reason, c.old.leader, c.new.leader, c.new.leader_epoch, c.new.replicas, c.new.isr)
        for tp in offline:
            if tp not in self._offline_reported:
                log.error("controller: %s-%d is offline: leader %d is gone and no live replica of the ISR %s "
                          "can lead (unclean.leader.election.enable is false)", tp[0], tp[1],
                          img.topics[tp[0]].partitions[tp[1]].leader, img.topics[tp[0]].partitions[tp[1]].isr)
        self._offline_reported = set(offline)

    async def _ensure_offsets_topic(self) -> None:
        name, partitions, rf, configs = self.cluster.offsets_topic_spec()
        img = self.cluster.image
        if name in img.topics or len(img.brokers) < rf:
            return   # Kafka, too, waits for offsets.topic.replication.factor brokers
        try:
            await self.create_topic(name, partitions, rf, configs, internal=True)
        except ControllerError as e:
            if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise

    # -- requests (CreateTopics, DeleteTopics, CreatePartitions, reassignments) ------------
    async def create_topic(self, name: str, num_partitions: int, replication_factor: int, configs: dict,
                           validate_only: bool = False, internal: bool = False) -> TopicImage | None:
        registry = self.cluster.broker.topics
        if not internal:
            self.cluster.validate_new_topic(name)
        img = self.cluster.image
        if name in img.topics:
            raise ControllerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise ControllerError(ErrorCode.INVALID_PARTITIONS, "number of partitions must be at least 1")
        registry.validate_configs(configs)
        registry.check_partition_budget(num_partitions)
        live = sorted(img.brokers)
        cfg = self.cluster.config
        rf = replication_factor if replication_factor > 0 else (
            cfg.replication_factor if cfg.replication_factor > 0 else len(live))
        if rf > len(live):
            raise ControllerError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                  f"replication factor {rf} with {len(live)} live brokers")
        fanout = int(configs.get("replication.fanout", cfg.fanout))
        if validate_only:
            return None
        if not self.active:
            raise NotController()
        t = TopicImage(name, uuid.uuid4(), dict(configs), fanout, num_partitions)
        partitions = [Op.put(partition_key(name, i), _new_partition(live, i, rf, fanout).to_value(self.epoch))
                      for i in range(num_partitions)]
        absent = Compare.create_revision(topic_key(name), "=", 0)
        async with self._topic_changes:
            # Partition keys left by a creation a former controller did not finish go first
            # (in a transaction of their own: etcd refuses a put inside a deleted range).
            if (img.partition_keys(name) and await self._write(
                    [absent], [Op.delete(f"{PARTITIONS}{name}/", prefix=True)]) is None) \
                    or not await self._write_topic([absent], partitions, Op.put(topic_key(name), t.to_value())):
                raise ControllerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        log.info("controller: created topic %s: %d partition(s), replication factor %d, fanout %d",
                 name, num_partitions, rf, fanout)
        return self.cluster.image.topics.get(name)

    async def delete_topic(self, name: str) -> None:
        t = self.cluster.image.topics.get(name)
        if t is None:
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        key = topic_key(name)
        await self._write([Compare.mod_revision(key, ">", 0)],
                          [Op.delete(key), Op.delete(f"{PARTITIONS}{name}/", prefix=True)])
        log.info("controller: deleted topic %s", name)

    async def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        t = self.cluster.image.topics.get(name)
        if t is None:
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        if total <= len(t.partitions):
            raise ControllerError(ErrorCode.INVALID_PARTITIONS,
                                  f"topic {name!r} has {len(t.partitions)} partitions; the count can only grow")
        self.cluster.broker.topics.check_partition_budget(total - len(t.partitions))
        live = sorted(self.cluster.image.brokers)
        rf = len(t.partitions[0].replicas)
        if rf > len(live):
            raise ControllerError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                  f"replication factor {rf} with {len(live)} live brokers")
        if validate_only:
            return
        grown = TopicImage(t.name, t.topic_id, t.configs, t.fanout, total)
        partitions = [Op.put(partition_key(name, i), _new_partition(live, i, rf, t.fanout).to_value(self.epoch))
                      for i in range(len(t.partitions), total)]
        unchanged = Compare.value(topic_key(name), "=", t.to_value())
        async with self._topic_changes:
            if not await self._write_topic([unchanged], partitions, Op.put(topic_key(name), grown.to_value())):
                raise ControllerError(ErrorCode.INVALID_PARTITIONS, f"topic {name!r} changed meanwhile; retry")

    async def _write_topic(self, compares: list, partitions: list, topic: dict) -> bool:
        """Write a topic's new partition keys and then its topic key, each transaction
        guarded by ``compares``; False when a guard failed. etcd refuses a transaction of
        more than --max-txn-ops operations (128 by default), so a topic of many partitions
        takes several: brokers show a topic only once its topic key and every partition key
        it counts have arrived (controller/image.py), so no broker sees half of it. A
        creation cut short leaves partition keys no topic counts, removed by the next
        creation of that name."""
        if len(partitions) < TXN_OPS:
            return await self._write(compares, partitions + [topic]) is not None
        for chunk in [partitions[i:i + TXN_OPS] for i in range(0, len(partitions), TXN_OPS)] + [[topic]]:
            if await self._write(compares, chunk) is None:
                return False
        return True

    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides (AlterConfigs, IncrementalAlterConfigs; the
        caller validated them). Every broker applies them from the watch."""
        t = self.cluster.image.topics.get(name)
        if t is None:
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        altered = TopicImage(t.name, t.topic_id, dict(configs), t.fanout, t.num_partitions)
        key = topic_key(name)
        if await self._write([Compare.value(key, "=", t.to_value())], [Op.put(key, altered.to_value())]) is None:
            raise ControllerError(ErrorCode.REQUEST_TIMED_OUT,
                                  f"topic {name!r} changed meanwhile; retry")
        log.info("controller: topic %s configs now %s", name, configs or "{}")

    async def set_broker_configs(self, resource: str, configs: dict[str, str]) -> None:
        """Replace the dynamic configs of one broker (``resource`` its node id) or of all
        (``resource`` "default"). Every broker applies them from the watch."""
        key = broker_configs_key(resource)
        op = Op.put(key, encode({"configs": configs})) if configs else Op.delete(key)
        await self._write([], [op])
        log.info("controller: dynamic broker configs of %s now %s", resource, configs or "{}")

    async def elect_leader(self, name: str, index: int, unclean: bool) -> None:
        """ElectLeaders for one partition. Preferred: move leadership to the preferred
        replica (replication.tree.preferred_leader) when it is live and in the ISR.
        Unclean (Kafka's UNCLEAN election type): only for a partition whose leader is
        gone; the first live ISR member, else the first live replica, which then leads
        with an ISR of itself (acknowledged records it lacks are lost, as in Kafka)."""
        img = self.cluster.image
        t = img.topics.get(name)
        if t is None or not 0 <= index < len(t.partitions):
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {name}-{index}")
        p = t.partitions[index]
        live = set(img.brokers)
        if unclean:
            if p.leader in live:
                raise ControllerError(ErrorCode.ELECTION_NOT_NEEDED, f"{name}-{index} has a live leader {p.leader}")
            e = choose_leader(p.replicas, p.isr, live, True)
            if e is None:
                raise ControllerError(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                                      f"no live replica of {name}-{index} can lead")
            new = PartitionImage(promote(p.replicas, e.leader, demoted=p.leader), p.leader_epoch + 1,
                                 e.isr if e.clean else [e.leader], p.mod_revision)
        else:
            preferred = preferred_leader(p.replicas, index)
            if preferred == p.leader and preferred in live:
                raise ControllerError(ErrorCode.ELECTION_NOT_NEEDED,
                                      f"{preferred} already leads {name}-{index}")
            if preferred not in live or preferred not in p.isr:
                raise ControllerError(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                                      f"preferred leader {preferred} of {name}-{index} is not live and in the "
                                      f"ISR {p.isr}")
            new = reassign(p, promote(p.replicas, preferred, demoted=p.leader))
        if not await self._write_partition(name, index, p, new):
            raise ControllerError(ErrorCode.REQUEST_TIMED_OUT, f"{name}-{index} changed meanwhile; retry")
        log.warning("controller: %s election of %s-%d: leader %d -> %d (epoch %d), isr %s",
                    "UNCLEAN" if unclean else "preferred", name, index, p.leader, new.leader,
                    new.leader_epoch, new.isr)

    async def set_tree(self, name: str, index: int, replicas: list[int], force: bool = False) -> None:
        t = self.cluster.image.topics.get(name)
        if t is None or not 0 <= index < len(t.partitions):
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {name}-{index}")
        p = t.partitions[index]
        if sorted(replicas) != sorted(p.replicas):
            raise ControllerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                  f"replicas {replicas} must be a reordering of {p.replicas}")
        if replicas[0] != p.leader and replicas[0] not in p.isr and not force:
            raise ControllerError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                  f"node {replicas[0]} is not in the ISR {p.isr} of {name}-{index}")
        new = reassign(p, replicas)
        if not await self._write_partition(name, index, p, new):
            raise ControllerError(ErrorCode.REASSIGNMENT_IN_PROGRESS, f"{name}-{index} changed meanwhile; retry")
        log.info("controller: %s-%d leader %d -> %d (epoch %d), tree %s", name, index, p.leader, new.leader,
                 new.leader_epoch, new.replicas)
