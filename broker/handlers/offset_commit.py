"""OffsetCommit (key 8), versions 0-9.

v0 carries neither generation nor member id (Kafka <= 2.x stored it in ZooKeeper; canopy
keeps it with the coordinator's offsets, as a standalone commit with generation -1); v1
adds generation, member id and a per-partition commit_timestamp (ignored: it only set
Kafka's per-offset expiry). Kafka 3.x serves v0-1 and sarama's offset manager uses v1;
Kafka 4.0 removed them (KIP-896). v2-4 carry retention_time_ms (ignored, as Kafka 2.1+ does: offsets.retention.minutes
rules); v3 throttle time; v5 drops retention; v6 committed_leader_epoch; v7
group_instance_id; v8 flexible; v9 is the first version allowed for KIP-848 groups but is
wire-identical to v8 and, for a classic group, still carries a generation id.
(v10 names topics by id: not served.)

Generation -1 with any member id (usually empty) on a group without members is a
standalone commit (assign() users: kcat, Spark); otherwise the member id and generation
must match the group's current ones. The response is sent once the offsets are durable
in ``__consumer_offsets``.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.OFFSET_COMMIT
MIN_VERSION, MAX_VERSION = 0, 9


async def handle(ctx, request: dict, version: int) -> dict:
    topics = request.get("topics") or []
    # Kafka: READ on the group (else every partition GROUP_AUTHORIZATION_FAILED), then READ
    # on each topic (TOPIC_AUTHORIZATION_FAILED; the others are still committed).
    if not ctx.allowed(Operation.READ, ResourceType.GROUP, request["group_id"]):
        errors = {(t["name"], p["partition_index"]): ErrorCode.GROUP_AUTHORIZATION_FAILED
                  for t in topics for p in t.get("partitions") or []}
    else:
        errors = {(t["name"], p["partition_index"]): ErrorCode.TOPIC_AUTHORIZATION_FAILED
                  for t in topics if not ctx.allowed(Operation.READ, ResourceType.TOPIC, t["name"])
                  for p in t.get("partitions") or []}
    offsets = [(t["name"], p["partition_index"], p["committed_offset"],
                p.get("committed_leader_epoch", -1) if version >= 6 else -1,
                p.get("committed_metadata"))
               for t in topics for p in t.get("partitions") or [] if (t["name"], p["partition_index"]) not in errors]
    if offsets or not errors:
        errors.update(await ctx.broker.groups.commit(
            request["group_id"], member_id=request.get("member_id") or "",
            group_instance_id=request.get("group_instance_id") if version >= 7 else None,
            generation_id=request.get("generation_id_or_member_epoch", -1) if version >= 1 else -1,
            offsets=offsets))
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"],
             "error_code": errors.get((t["name"], p["partition_index"]), 0)}
            for p in t.get("partitions") or []]}
        for t in topics]}
