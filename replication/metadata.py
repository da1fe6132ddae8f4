"""Cluster metadata as a replicated log (seed 001's "register", Kafka's KRaft idea).

The controller decides topics, partitions, replication trees, leaders and leader epochs,
and records each decision as one record in the ``__cluster_metadata`` partition, whose
leader is the controller and which every other broker replicates like any partition.
Every broker applies the same records in the same order to a ``MetadataImage``, so all
of them answer Metadata identically. Records are JSON (small, rare, easy to inspect with
kcat); this module is pure: records in, image out.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

METADATA_TOPIC = "__cluster_metadata"


@dataclass
class PartitionImage:
    replicas: list[int]        # breadth-first tree order; replicas[0] is the leader
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)   # as last reported by the leader

    @property
    def leader(self) -> int:
        return self.replicas[0] if self.replicas else -1


@dataclass
class TopicImage:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    fanout: int
    partitions: list[PartitionImage] = field(default_factory=list)


class MetadataImage:
    def __init__(self) -> None:
        self.topics: dict[str, TopicImage] = {}
        self.applied_offset = -1   # offset of the last record applied

    def apply(self, offset: int, event: dict) -> TopicImage | None:
        """Apply one record; returns the topic it touched (None for a deleted topic)."""
        self.applied_offset = offset
        kind = event["type"]
        name = event["name"]
        if kind == "topic":
            t = TopicImage(name, uuid.UUID(event["id"]), dict(event.get("configs", {})), int(event["fanout"]),
                           [PartitionImage(list(p["replicas"]), int(p.get("leader_epoch", 0)), [p["replicas"][0]])
                            for p in event["partitions"]])
            self.topics[name] = t
            return t
        if kind == "delete_topic":
            self.topics.pop(name, None)
            return None
        t = self.topics.get(name)
        if t is None:
            return None
        if kind == "add_partitions":
            t.partitions.extend(PartitionImage(list(p["replicas"]), int(p.get("leader_epoch", 0)),
                                               [p["replicas"][0]]) for p in event["partitions"])
        elif kind == "leader":
            p = t.partitions[int(event["partition"])]
            p.replicas = list(event["replicas"])
            p.leader_epoch = int(event["leader_epoch"])
            p.isr = list(event.get("isr") or [p.replicas[0]])
        elif kind == "isr":
            p = t.partitions[int(event["partition"])]
            if int(event["leader_epoch"]) == p.leader_epoch:   # a stale leader's report is void
                p.isr = list(event["isr"])
        return t


def encode_event(event: dict) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def decode_event(value: bytes) -> dict | None:
    try:
        event = json.loads(bytes(value))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict) or "type" not in event or "name" not in event:
        return None
    return event


def topic_event(name: str, topic_id: uuid.UUID, configs: dict, fanout: int, partitions: list[list[int]]) -> dict:
    return {"type": "topic", "name": name, "id": str(topic_id), "configs": configs, "fanout": fanout,
            "partitions": [{"replicas": r, "leader_epoch": 0} for r in partitions]}


def leader_event(name: str, partition: int, replicas: list[int], leader_epoch: int,
                 isr: list[int] | None = None) -> dict:
    return {"type": "leader", "name": name, "partition": partition, "replicas": replicas,
            "leader_epoch": leader_epoch, "isr": isr or [replicas[0]]}


def isr_event(name: str, partition: int, leader_epoch: int, isr: list[int]) -> dict:
    return {"type": "isr", "name": name, "partition": partition, "leader_epoch": leader_epoch, "isr": isr}
