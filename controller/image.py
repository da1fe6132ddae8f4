"""The cluster's metadata as etcd holds it, and the image every broker builds from it.

Kafka's ZooKeeper layout is the model (ZkData.scala): one leased key for the controller,
one leased key per live broker, one key per topic and one per partition, each partition
key updated only by compare-and-swap on its revision. Values are JSON (small, rare, easy
to read with ``etcdctl get --prefix /canopy/``)::

    /canopy/cluster                    {"id": uuid}              created once: which cluster this is
    /canopy/controller                 {"node_id": N}            leased; its create revision
                                                                 is the controller epoch
    /canopy/brokers/<id>               {"host", "port", "rack",  leased: a lost lease is a dead broker;
                                        "listeners": {NAME:      host/port are the inter-broker
                                          {"host", "port"}},     listener's, listeners all advertised ones;
                                        "http": {"host", "port"}} its --http-listen address (optional)
    /canopy/topics/<name>              {"id", "configs", "fanout", "partitions": count}
    /canopy/partitions/<name>/<i>      {"replicas", "leader_epoch", "isr", "controller_epoch"}
    /canopy/producer_id_block          {"next": first id of the next free block}
    /canopy/users/<name>               {"SCRAM-SHA-256": {"salt", "stored_key", "server_key",
                                        "iterations"}, ...}      SCRAM credentials, salted keys only
                                                                 (broker/security/scram.py)
    /canopy/acls/<type>/<pattern>/<name>/<principal>/<host>/<operation>/<permission>
                                       one ACL binding (broker/security/acl.py's JSON form);
                                       path parts percent-encoded, the value is what counts
    /canopy/broker_configs/<id>        {"configs": {name: value}}  dynamic broker configs
                                                                 (AlterConfigs on a BROKER resource);
                                                                 <id> "default" is the cluster default

This module is pure: etcd key-values in, image out. Every broker applies the same keys at
the same revisions, so every broker answers Metadata alike.
"""
from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass, field

PREFIX = "/canopy/"
CLUSTER_KEY = PREFIX + "cluster"
CONTROLLER_KEY = PREFIX + "controller"
BROKERS = PREFIX + "brokers/"
TOPICS = PREFIX + "topics/"
PARTITIONS = PREFIX + "partitions/"
PRODUCER_ID_BLOCK_KEY = PREFIX + "producer_id_block"
USERS = PREFIX + "users/"
ACLS = PREFIX + "acls/"

_acl_generations = itertools.count(1)
BROKER_CONFIGS = PREFIX + "broker_configs/"
DEFAULT_BROKER_CONFIGS = "default"   # Kafka's empty broker resource name: every broker


def broker_key(node_id: int) -> str:
    return f"{BROKERS}{node_id}"


def broker_configs_key(name: str) -> str:
    """``name``: a node id, or DEFAULT_BROKER_CONFIGS for the cluster-wide default."""
    return BROKER_CONFIGS + name


def topic_key(name: str) -> str:
    return TOPICS + name


def user_key(name: str) -> str:
    return USERS + name


def partition_key(name: str, index: int) -> str:
    return f"{PARTITIONS}{name}/{index}"


def encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def broker_registration(host: str, port: int, rack: str | None, listeners: dict[str, tuple[str, int]],
                        http: tuple[str, int] | None = None) -> dict:
    """The value of /canopy/brokers/<id>. ``host``/``port``: the inter-broker listener's
    advertised address (what replication and forwarding dial); ``listeners``: every
    advertised listener, so each broker can answer Metadata on any listener (KIP-103)."""
    out = {"host": host, "port": port, "rack": rack,
           "listeners": {name: {"host": h, "port": p} for name, (h, p) in listeners.items()}}
    if http is not None:
        # The broker's HTTP port (--http-listen), where the status page asks each broker
        # for its own view of its replicas (broker/http/status.py).
        out["http"] = {"host": http[0], "port": http[1]}
    return out


@dataclass
class BrokerInfo:
    node_id: int
    host: str                      # the inter-broker listener's advertised address
    port: int
    rack: str | None
    registered_revision: int = 0   # create revision of its key: which incarnation this is
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)   # name -> advertised address
    http: tuple[str, int] | None = None   # its --http-listen address as peers reach it, if it serves HTTP

    def address(self, listener: str | None) -> tuple[str, int] | None:
        """The advertised address on ``listener`` (None: the inter-broker one). A broker
        registered before listeners existed has only host/port: that is its one listener."""
        if listener is None or not self.listeners:
            return self.host, self.port
        return self.listeners.get(listener)


@dataclass
class PartitionImage:
    replicas: list[int]        # breadth-first tree order; replicas[0] is the leader
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)   # the committed ISR
    mod_revision: int = 0      # the partition epoch: compare-and-swap on it

    @property
    def leader(self) -> int:
        return self.replicas[0] if self.replicas else -1

    def to_value(self, controller_epoch: int) -> bytes:
        return encode({"replicas": self.replicas, "leader_epoch": self.leader_epoch, "isr": self.isr,
                       "controller_epoch": controller_epoch})


@dataclass
class TopicImage:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    fanout: int
    num_partitions: int
    partitions: list[PartitionImage] = field(default_factory=list)

    def to_value(self) -> bytes:
        return encode({"id": str(self.topic_id), "configs": self.configs, "fanout": self.fanout,
                       "partitions": self.num_partitions})

    @property
    def complete(self) -> bool:
        return len(self.partitions) == self.num_partitions


def _decode(value: bytes | None) -> dict | None:
    """None for a delete. A put must hold a JSON object: an empty or ``null`` value (a
    mistaken ``etcdctl put``) is unreadable, never taken for a delete, which would make
    every broker drop the topic and its data while etcd still holds the key."""
    if value is None:
        return None
    data = json.loads(value)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


class ClusterImage:
    """Applies etcd puts and deletes under /canopy/; remembers what each one touched."""

    def __init__(self) -> None:
        self.revision = 0
        self.controller_id = -1
        self.controller_epoch = -1
        self.brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicImage] = {}
        self._complete: dict[str, TopicImage] = {}
        self._partitions: dict[str, dict[int, PartitionImage]] = {}
        self.unreadable: list[str] = []   # keys whose value could not be decoded
        # SCRAM credentials: {user: {mechanism: credential JSON}}, and each user key's
        # mod revision (credential changes compare-and-swap on it).
        self.users: dict[str, dict] = {}
        self.user_revisions: dict[str, int] = {}
        # ACL bindings as stored (key -> JSON object); the broker's authorizer rebuilds its
        # index when the generation changes (unique across images, so a reload counts too).
        self.acls: dict[str, dict] = {}
        self.acl_generation = next(_acl_generations)
        self.broker_configs: dict[str, dict[str, str]] = {}   # node id or "default" -> dynamic configs

    @property
    def topics(self) -> dict[str, TopicImage]:
        """Topics whose every partition key has arrived (a creation is one transaction,
        but a reader never sees half of one either way). Read-only for callers."""
        return self._complete

    def knows_topic(self, name: str) -> bool:
        """Whether the topic key exists, complete or not."""
        return name in self._topics

    def apply(self, key: str, value: bytes | None, mod_revision: int = 0, create_revision: int = 0) -> str | None:
        """One put (value) or delete (None). Returns the topic name it touched, "" for a
        broker or controller change, None for keys outside the layout."""
        try:
            return self._apply(key, value, mod_revision, create_revision)
        except (ValueError, KeyError, TypeError, AttributeError):
            self.unreadable.append(key)
            return None

    def _apply(self, key: str, value: bytes | None, mod_revision: int, create_revision: int) -> str | None:
        if key.startswith(USERS):
            name = key[len(USERS):]
            data = _decode(value)
            if data is None:
                self.users.pop(name, None)
                self.user_revisions.pop(name, None)
            else:
                # Kept as JSON: broker/security/scram.py reads the credentials out of it.
                self.users[name] = {str(m): dict(c) for m, c in data.items()}
                self.user_revisions[name] = mod_revision
            return ""
        if key.startswith(ACLS):
            data = _decode(value)
            if data is None:
                self.acls.pop(key, None)
            else:
                self.acls[key] = data
            self.acl_generation = next(_acl_generations)
            return ""
        if key != CONTROLLER_KEY and not key.startswith((BROKERS, TOPICS, PARTITIONS, BROKER_CONFIGS)):
            return None   # e.g. the producer-id block, or a key of a newer canopy: not ours to read
        data = _decode(value)
        if key == CONTROLLER_KEY:
            self.controller_id = int(data["node_id"]) if data else -1
            self.controller_epoch = create_revision if data else -1
            return ""
        if key.startswith(BROKER_CONFIGS):
            name = key[len(BROKER_CONFIGS):]
            if data is None:
                self.broker_configs.pop(name, None)
            else:
                self.broker_configs[name] = {str(k): str(v) for k, v in data["configs"].items()}
            return ""
        if key.startswith(BROKERS):
            node = int(key[len(BROKERS):])
            if data is None:
                self.brokers.pop(node, None)
            else:
                listeners = {str(name): (str(a["host"]), int(a["port"]))
                             for name, a in (data.get("listeners") or {}).items()}
                http = data.get("http")
                self.brokers[node] = BrokerInfo(node, str(data["host"]), int(data["port"]), data.get("rack"),
                                                create_revision, listeners,
                                                (str(http["host"]), int(http["port"])) if http else None)
            return ""
        if key.startswith(TOPICS):
            name = key[len(TOPICS):]
            if data is None:
                self._topics.pop(name, None)
                self._complete.pop(name, None)
                self._partitions.pop(name, None)
                return name
            old = self._topics.get(name)
            t = TopicImage(name, uuid.UUID(data["id"]), {str(k): str(v) for k, v in data["configs"].items()},
                           int(data["fanout"]), int(data["partitions"]))
            if old is not None and old.topic_id != t.topic_id:
                self._partitions.pop(name, None)   # deleted and re-created
            self._topics[name] = t
            self._rebuild(name)
            return name
        if key.startswith(PARTITIONS):
            name, _, index = key[len(PARTITIONS):].rpartition("/")
            parts = self._partitions.setdefault(name, {})
            if data is None:
                parts.pop(int(index), None)
            else:
                parts[int(index)] = PartitionImage([int(r) for r in data["replicas"]], int(data["leader_epoch"]),
                                                   [int(r) for r in data["isr"]], mod_revision)
            self._rebuild(name)
            return name
        return None

    def _rebuild(self, name: str) -> None:
        t = self._topics.get(name)
        if t is None:
            return
        parts = self._partitions.get(name, {})
        t.partitions = [parts[i] for i in range(t.num_partitions) if i in parts]
        if t.complete:
            self._complete[name] = t
        else:
            self._complete.pop(name, None)

    def partition_keys(self, name: str) -> int:
        """How many partition keys of this name etcd holds (a topic's, or ones left by a
        creation that did not finish)."""
        return len(self._partitions.get(name, {}))

    def partition(self, name: str, index: int) -> PartitionImage | None:
        return self._partitions.get(name, {}).get(index)
