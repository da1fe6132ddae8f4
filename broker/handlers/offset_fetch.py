"""OffsetFetch (key 9), versions 0-8.

v0 and v1 are the same on the wire; Kafka <= 2.x read v0 from ZooKeeper, canopy answers
both from the coordinator (where OffsetCommit v0 writes too). Kafka 4.0 removed v0
(KIP-896); clients configured for old brokers still send it. v2
adds a top-level error and null topics = every partition the group committed; v3 throttle
time; v5 committed_leader_epoch; v6 flexible; v7 require_stable (KIP-447: canopy has no
pending transactional offsets, so every offset is stable); v8 batches several groups.
(v9 adds member id/epoch for KIP-848 groups: not served.)

A partition without a committed offset answers offset -1, leader epoch -1 and metadata ""
(Kafka's OffsetFetchResponse.NO_METADATA) with no error.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.OFFSET_FETCH
MIN_VERSION, MAX_VERSION = 0, 8


def _partitions(entries) -> list:
    out = []
    for p, e in entries:
        if e is None:
            out.append({"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                        "metadata": "", "error_code": 0})
        else:
            out.append({"partition_index": p, "committed_offset": e.offset,
                        "committed_leader_epoch": e.leader_epoch, "metadata": e.metadata,
                        "error_code": 0})
    return out


def _group(ctx, coord, group_id: str, topics) -> list:
    # Kafka: topics the principal may not DESCRIBE are left out of an all-topics answer
    # and answered TOPIC_AUTHORIZATION_FAILED when named.
    wanted = None if topics is None else [(t["name"], list(t.get("partition_indexes") or []))
                                          for t in topics]
    out = []
    for t, entries in coord.fetch(group_id, wanted):
        if ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t):
            out.append({"name": t, "partitions": _partitions(entries)})
        elif wanted is not None:
            out.append({"name": t, "partitions": [
                {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                 "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED} for p, _ in entries]})
    return out


def _group_error(ctx, coord, group_id: str) -> int:
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id):   # Kafka: DESCRIBE on the group
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    return coord.coordinator_error(group_id)


async def handle(ctx, request: dict, version: int) -> dict:
    coord = ctx.broker.groups
    if version >= 8:
        groups = []
        for g in request.get("groups") or []:
            err = _group_error(ctx, coord, g["group_id"])
            groups.append({"group_id": g["group_id"], "error_code": err,
                           "topics": [] if err else _group(ctx, coord, g["group_id"], g.get("topics"))})
        return {"throttle_time_ms": 0, "groups": groups}
    topics = request.get("topics")
    if version < 2 and topics is None:
        topics = []
    err = _group_error(ctx, coord, request["group_id"])
    if err:
        # (NOT_COORDINATOR etc.) Before v2 there is no top-level error: it goes on each partition.
        return {"throttle_time_ms": 0, "error_code": err, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": i, "committed_offset": -1, "committed_leader_epoch": -1,
                 "metadata": "", "error_code": err} for i in t.get("partition_indexes") or []]}
            for t in topics or []]}
    return {"throttle_time_ms": 0, "error_code": 0,
            "topics": _group(ctx, coord, request["group_id"], topics)}
