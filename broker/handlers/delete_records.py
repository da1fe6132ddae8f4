"""DeleteRecords (key 21), versions 0-2.

v1 is the same as v0; v2 flexible. Advances the partition's log start offset to the given
offset (-1 means the high watermark); whole segments below it are deleted, and fetches
below it answer OFFSET_OUT_OF_RANGE. An offset beyond the high watermark is
OFFSET_OUT_OF_RANGE, as in Kafka.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.DELETE_RECORDS
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx, request: dict, version: int) -> dict:
    registry = ctx.broker.topics
    topics = []
    for t in request["topics"]:
        topic = registry.get(t["name"])
        denied = not ctx.allowed(Operation.DELETE, ResourceType.TOPIC, t["name"])   # Kafka: DELETE on the topic
        parts = []
        for pr in t["partitions"]:
            idx, offset = pr["partition_index"], pr["offset"]
            out = {"partition_index": idx, "low_watermark": -1, "error_code": 0}
            p = topic.partitions[idx] if topic is not None and 0 <= idx < len(topic.partitions) else None
            if denied:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif p is None or not p.is_replica:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not p.is_leader:
                # Sent to the leader (as in Kafka); followers learn the new log start offset
                # from their upstream's Fetch responses and delete their segments too.
                out["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                if offset == -1:
                    offset = p.high_watermark
                if offset < 0 or offset > p.high_watermark:
                    out["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    out["low_watermark"] = p.log.delete_records_before(offset) if offset > p.log_start_offset \
                        else p.log_start_offset
            parts.append(out)
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
