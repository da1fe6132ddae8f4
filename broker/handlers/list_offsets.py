"""ListOffsets (key 2), versions 1-8.

v1 single offset per partition (v0's max_num_offsets list is not offered); v2
isolation_level; v4 current_leader_epoch and leader_epoch in the answer; v6 flexible;
v7 MAX_TIMESTAMP (-3, KIP-734); v8 EARLIEST_LOCAL (-4, KIP-405: canopy keeps everything
local, so it equals earliest).

A timestamp with no record at or after it answers offset -1, timestamp -1 and no error:
Spark's offset reader relies on that to mean "no match".
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from .fetch import check_leader_epoch

API_KEY = ApiKey.LIST_OFFSETS
MIN_VERSION, MAX_VERSION = 1, 8

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4


DEBUGGING_REPLICA_ID = -2


def lookup(partition, timestamp: int, replica_id: int = -1) -> tuple[ErrorCode, int, int]:
    """(error, offset, timestamp) for one ListOffsets spec."""
    lg = partition.log
    if timestamp == LATEST:
        # Consumers see the high watermark; replicas and Kafka's "debugging consumer" (-2,
        # used by the controller to compare candidates) see the log end offset.
        return ErrorCode.NONE, (partition.high_watermark if replica_id == -1 else lg.log_end_offset), -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return ErrorCode.NONE, lg.log_start_offset, -1
    if timestamp == MAX_TIMESTAMP:
        found = lg.max_timestamp_offset()
        return (ErrorCode.NONE, *found) if found else (ErrorCode.NONE, -1, -1)
    if timestamp < 0:
        return ErrorCode.INVALID_REQUEST, -1, -1
    found = lg.offset_for_timestamp(timestamp)
    if found is None or found[0] >= partition.high_watermark:
        return ErrorCode.NONE, -1, -1
    return ErrorCode.NONE, found[0], found[1]


async def handle(ctx, request: dict, version: int) -> dict:
    registry = ctx.broker.topics
    replica_id = request.get("replica_id", -1)
    topics = []
    for t in request["topics"]:
        topic = registry.get(t["name"])
        denied = not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t["name"])   # Kafka: DESCRIBE on the topic
        parts = []
        for pr in t["partitions"]:
            idx = pr["partition_index"]
            out = {"partition_index": idx, "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
            p = topic.partitions[idx] if topic is not None and 0 <= idx < len(topic.partitions) else None
            if denied:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif p is None or not p.is_replica:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif replica_id != DEBUGGING_REPLICA_ID and not p.is_leader:
                out["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER   # as Kafka: ask the leader
            else:
                err = check_leader_epoch(p, pr.get("current_leader_epoch", -1))
                if not err:
                    err, out["offset"], out["timestamp"] = lookup(p, pr["timestamp"], replica_id)
                out["error_code"] = err
                out["leader_epoch"] = p.leader_epoch
            parts.append(out)
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
