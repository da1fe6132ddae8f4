"""Topics and partitions on this broker: the registry every handler works through.

Layout under the data directory::

    topics/<name>/topic.json      topic id, partition count, topic-level configs
    topics/<name>/<partition>/    one storage.Log per partition

Topic names are restricted by Kafka to [a-zA-Z0-9._-] (max 249 chars), so they are safe
as directory names.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import trio

from protocol.errors import ErrorCode
from storage import Log, LogConfig

from .producer_state import ProducerStateTable

log = logging.getLogger("canopy.topics")

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets"})

# Topic configs canopy understands (CreateTopics / DescribeConfigs), with Kafka's names.
TOPIC_CONFIG_KEYS = {
    "retention.ms": "log_retention_ms",
    "retention.bytes": "log_retention_bytes",
    "segment.bytes": "log_segment_bytes",
    "segment.ms": "log_segment_ms",
    "max.message.bytes": "message_max_bytes",
    "message.timestamp.type": None,
    "cleanup.policy": None,
    "min.insync.replicas": None,
    "compression.type": None,
}


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


class Partition:
    """One partition's log plus the broker-side state around it."""

    def __init__(self, topic: "Topic", index: int, log_: Log):
        self.topic = topic
        self.index = index
        self.log = log_
        # Kafka keeps the leader epoch stable until leadership changes; a moving epoch
        # makes clients call OffsetForLeaderEpoch. Single node: leader since creation.
        self.leader_epoch = 0
        self.producers = ProducerStateTable()
        self.producers.rebuild(self.log.iter_batch_headers())
        # Long-polling fetches park an Event here; an append sets them all. One Event per
        # waiting Fetch (not per partition) lets a Fetch wait on many partitions at once.
        self.waiters: set[trio.Event] = set()

    @property
    def high_watermark(self) -> int:
        # Single node: every appended batch is on all (one) in-sync replicas.
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def notify_append(self) -> None:
        """Wake every long-polling Fetch waiting on this partition."""
        if self.waiters:
            for ev in self.waiters:
                ev.set()
            self.waiters.clear()


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    directory: Path
    partitions: list[Partition] = field(default_factory=list)

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def timestamp_type(self) -> str:
        return self.configs.get("message.timestamp.type", "CreateTime")

    def save(self) -> None:
        meta = {"topic_id": str(self.topic_id), "partitions": len(self.partitions), "configs": self.configs}
        tmp = self.directory / "topic.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, self.directory / "topic.json")


class TopicRegistry:
    def __init__(self, data_dir: Path, config):
        self.root = Path(data_dir) / "topics"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[uuid.UUID, Topic] = {}

    # -- configs ---------------------------------------------------------------
    def log_config(self, topic_configs: dict[str, str]) -> LogConfig:
        c = self.config
        merged = {
            "retention.ms": str(c.log_retention_ms),
            "retention.bytes": str(c.log_retention_bytes),
            "segment.bytes": str(c.log_segment_bytes),
            "segment.ms": str(c.log_segment_ms),
            "max.message.bytes": str(c.message_max_bytes),
        }
        merged.update(topic_configs)
        return LogConfig.from_topic_configs(merged)

    def effective_configs(self, topic: Topic) -> dict[str, tuple[str, bool]]:
        """config name -> (value, is_default) as DescribeConfigs reports them."""
        c = self.config
        defaults = {
            "retention.ms": str(c.log_retention_ms),
            "retention.bytes": str(c.log_retention_bytes),
            "segment.bytes": str(c.log_segment_bytes),
            "segment.ms": str(c.log_segment_ms),
            "max.message.bytes": str(c.message_max_bytes),
            "message.timestamp.type": "CreateTime",
            "cleanup.policy": "delete",
            "min.insync.replicas": "1",
            "compression.type": "producer",
        }
        out = {k: (v, True) for k, v in defaults.items()}
        for k, v in topic.configs.items():
            out[k] = (v, False)
        return out

    @staticmethod
    def validate_configs(configs: dict[str, str]) -> None:
        for key, value in configs.items():
            if key not in TOPIC_CONFIG_KEYS:
                raise TopicError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
            if value is None:
                raise TopicError(ErrorCode.INVALID_CONFIG, f"config {key!r} has no value")
            if key == "message.timestamp.type":
                if value not in ("CreateTime", "LogAppendTime"):
                    raise TopicError(ErrorCode.INVALID_CONFIG,
                                     f"message.timestamp.type must be CreateTime or LogAppendTime")
            elif key == "cleanup.policy":
                if value != "delete":
                    raise TopicError(ErrorCode.INVALID_CONFIG, "only cleanup.policy=delete is supported")
            elif key == "compression.type":
                if value not in ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"):
                    raise TopicError(ErrorCode.INVALID_CONFIG, f"bad compression.type {value!r}")
            else:
                try:
                    n = int(value)
                except ValueError:
                    raise TopicError(ErrorCode.INVALID_CONFIG, f"config {key!r} must be an integer") from None
                if key in ("segment.bytes", "max.message.bytes", "segment.ms", "min.insync.replicas") and n <= 0:
                    raise TopicError(ErrorCode.INVALID_CONFIG, f"config {key!r} must be positive")
                if key in ("retention.ms", "retention.bytes") and n < -1:
                    raise TopicError(ErrorCode.INVALID_CONFIG, f"config {key!r} must be >= -1")

    # -- lifecycle -------------------------------------------------------------
    def load(self) -> None:
        for d in sorted(self.root.iterdir()):
            meta_path = d / "topic.json"
            if not meta_path.exists():
                if d.name.endswith(".deleting"):
                    shutil.rmtree(d, ignore_errors=True)
                continue
            meta = json.loads(meta_path.read_text())
            topic = Topic(d.name, uuid.UUID(meta["topic_id"]), meta.get("configs", {}), d)
            lc = self.log_config(topic.configs)
            for i in range(meta["partitions"]):
                topic.partitions.append(Partition(topic, i, Log(d / str(i), lc)))
            self.topics[topic.name] = topic
            self.by_id[topic.topic_id] = topic
            log.info("loaded topic %s (%d partitions)", topic.name, len(topic.partitions))

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def partition(self, name: str, index: int) -> Partition | None:
        t = self.topics.get(name)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]

    def create(self, name: str, num_partitions: int, configs: dict[str, str] | None = None,
               *, validate_only: bool = False) -> Topic | None:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "number of partitions must be at least 1")
        if num_partitions > 10_000:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "at most 10000 partitions per topic")
        configs = dict(configs or {})
        self.validate_configs(configs)
        if validate_only:
            return None
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        topic = Topic(name, uuid.uuid4(), configs, d)
        lc = self.log_config(configs)
        for i in range(num_partitions):
            topic.partitions.append(Partition(topic, i, Log(d / str(i), lc)))
        topic.save()
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
        if validate_only:
            return
        lc = self.log_config(topic.configs)
        for i in range(len(topic.partitions), total):
            topic.partitions.append(Partition(topic, i, Log(topic.directory / str(i), lc)))
        topic.save()

    def delete(self, name: str) -> Topic:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        self.by_id.pop(topic.topic_id, None)
        # Rename first so a crash mid-delete never resurrects a half-deleted topic.
        graveyard = topic.directory.with_name(topic.directory.name + f".{uuid.uuid4().hex[:8]}.deleting")
        (topic.directory / "topic.json").unlink(missing_ok=True)
        for p in topic.partitions:
            p.log.close()
            p.notify_append()
        os.replace(topic.directory, graveyard)
        shutil.rmtree(graveyard, ignore_errors=True)
        log.info("deleted topic %s", name)
        return topic

    def all_partitions(self):
        for t in list(self.topics.values()):
            yield from t.partitions

    def close(self) -> None:
        for p in self.all_partitions():
            p.log.close()
