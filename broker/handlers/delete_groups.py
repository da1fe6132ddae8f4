"""DeleteGroups (key 42), versions 0-2.

v1 is the same as v0; v2 flexible. Each group is answered on its own: the coordinator
deletes a group without members and its committed offsets (tombstones in
``__consumer_offsets``); a group with members is NON_EMPTY_GROUP, an unknown one
GROUP_ID_NOT_FOUND, a group another broker coordinates NOT_COORDINATOR (the admin
client sends each group to its coordinator), as in Kafka.
"""
from protocol.messages import ApiKey

API_KEY = ApiKey.DELETE_GROUPS
MIN_VERSION, MAX_VERSION = 0, 2


async def handle(ctx, request: dict, version: int) -> dict:
    coord = ctx.broker.groups
    results = []
    for gid in request.get("groups_names") or []:
        results.append({"group_id": gid, "error_code": await coord.delete_group(gid)})
    return {"throttle_time_ms": 0, "results": results}
