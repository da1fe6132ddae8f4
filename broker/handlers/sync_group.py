"""SyncGroup (key 14), versions 0-5.

v1 throttle time; v3 group_instance_id; v4 flexible; v5 protocol_type/protocol_name in
request (checked against the group: INCONSISTENT_GROUP_PROTOCOL) and response.

The leader's request carries every member's assignment; followers' requests wait until it
arrives (or until the generation is abandoned: REBALANCE_IN_PROGRESS).
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.SYNC_GROUP
MIN_VERSION, MAX_VERSION = 0, 5


async def handle(ctx, request: dict, version: int) -> dict:
    if not ctx.allowed(Operation.READ, ResourceType.GROUP, request["group_id"]):   # Kafka: READ on the group
        return {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "protocol_type": None,
                "protocol_name": None, "assignment": b""}
    r = await ctx.broker.groups.sync(
        request["group_id"], member_id=request.get("member_id") or "",
        group_instance_id=request.get("group_instance_id") if version >= 3 else None,
        generation_id=request["generation_id"],
        protocol_type=request.get("protocol_type") if version >= 5 else None,
        protocol_name=request.get("protocol_name") if version >= 5 else None,
        assignments={a["member_id"]: a["assignment"] for a in request.get("assignments") or []})
    return {"throttle_time_ms": 0, "error_code": r.error, "protocol_type": r.protocol_type,
            "protocol_name": r.protocol_name, "assignment": r.assignment or b""}
