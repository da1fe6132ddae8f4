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
from protocol.messages import ApiKey

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


def _group(coord, group_id: str, topics) -> list:
    wanted = None if topics is None else [(t["name"], list(t.get("partition_indexes") or []))
                                          for t in topics]
    return [{"name": t, "partitions": _partitions(entries)}
            for t, entries in coord.fetch(group_id, wanted)]


async def handle(ctx, request: dict, version: int) -> dict:
    coord = ctx.broker.groups
    if version >= 8:
        groups = []
        for g in request.get("groups") or []:
            err = coord.coordinator_error(g["group_id"])
            groups.append({"group_id": g["group_id"], "error_code": err,
                           "topics": [] if err else _group(coord, g["group_id"], g.get("topics"))})
        return {"throttle_time_ms": 0, "groups": groups}
    topics = request.get("topics")
    if version < 2 and topics is None:
        topics = []
    err = coord.coordinator_error(request["group_id"])
    if err:
        # (NOT_COORDINATOR etc.) Before v2 there is no top-level error: it goes on each partition.
        return {"throttle_time_ms": 0, "error_code": err, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": i, "committed_offset": -1, "committed_leader_epoch": -1,
                 "metadata": "", "error_code": err} for i in t.get("partition_indexes") or []]}
            for t in topics or []]}
    return {"throttle_time_ms": 0, "error_code": 0,
            "topics": _group(coord, request["group_id"], topics)}
