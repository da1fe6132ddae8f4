"""OffsetDelete (key 47), version 0.

Deletes a group's committed offsets for some partitions (KIP-496). The group error is
GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP for a non-consumer group with
members; per partition, GROUP_SUBSCRIBED_TO_TOPIC when a member of the consumer group
subscribes to the topic, UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist,
as Kafka answers.
"""
from protocol.messages import ApiKey

API_KEY = ApiKey.OFFSET_DELETE
MIN_VERSION, MAX_VERSION = 0, 0


async def handle(ctx, request: dict, version: int) -> dict:
    topics = request.get("topics") or []
    wanted = [(t["name"], p["partition_index"]) for t in topics for p in t.get("partitions") or []]
    err, result = await ctx.broker.groups.delete_offsets(request["group_id"], wanted)
    if err:
        return {"error_code": err, "throttle_time_ms": 0, "topics": []}
    return {"error_code": 0, "throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": result[(t["name"], p["partition_index"])]}
            for p in t.get("partitions") or []]}
        for t in topics]}
