"""Metadata (key 3), versions 0-12.

v0: an empty topic list means all topics; v1+ uses null for that, adds controller_id and
is_internal. v2 cluster_id, v4 allow_auto_topic_creation, v5 offline_replicas, v7
leader_epoch, v8-10 authorized operations, v9 flexible, v10 topic ids, v12 lets the request
name topics by id only.

Auto-creation: kcat, librdkafka and Java producers expect a topic they ask for to appear;
canopy creates it at once and answers with the real metadata (Kafka may instead answer
LEADER_NOT_AVAILABLE while creating; both are accepted by clients).
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.schema import ZERO_UUID

from ..topics import TopicError

API_KEY = ApiKey.METADATA
MIN_VERSION, MAX_VERSION = 0, 12


def topic_metadata(broker, topic, version: int) -> dict:
    node = broker.node_id
    return {
        "error_code": 0, "name": topic.name, "topic_id": topic.topic_id,
        "is_internal": topic.is_internal,
        "partitions": [{
            "error_code": 0, "partition_index": p.index, "leader_id": node,
            "leader_epoch": p.leader_epoch, "replica_nodes": [node], "isr_nodes": [node],
            "offline_replicas": [],
        } for p in topic.partitions],
    }


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    registry = broker.topics
    requested = request.get("topics")
    if version == 0 and requested == []:
        requested = None
    if version >= 4:
        auto_create = request.get("allow_auto_topic_creation", True) and broker.config.auto_create_topics
    else:
        auto_create = broker.config.auto_create_topics
    topics = []
    if requested is None:
        topics = [topic_metadata(broker, t, version) for t in registry.topics.values()]
    else:
        for entry in requested:
            name, topic_id = entry.get("name"), entry.get("topic_id")
            topic = registry.get(name) if name is not None else registry.by_id.get(topic_id)
            if topic is None and name is not None and auto_create:
                try:
                    topic = registry.create(name, broker.config.num_partitions)
                except TopicError as e:
                    if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                        topics.append({"error_code": e.code, "name": name, "topic_id": ZERO_UUID,
                                       "partitions": []})
                        continue
                    topic = registry.get(name)
            if topic is None:
                topics.append({"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None
                               else ErrorCode.UNKNOWN_TOPIC_ID,
                               "name": name, "topic_id": topic_id or ZERO_UUID, "partitions": []})
                continue
            topics.append(topic_metadata(broker, topic, version))
    return {
        "throttle_time_ms": 0,
        "brokers": broker.brokers(),
        "cluster_id": broker.config.cluster_id,
        "controller_id": broker.controller_id,
        "topics": topics,
    }
