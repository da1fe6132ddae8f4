"""Heartbeat (key 12), versions 0-4.

v1 throttle time; v3 group_instance_id; v4 flexible. REBALANCE_IN_PROGRESS tells a member
to rejoin; ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID that its membership is stale.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.HEARTBEAT
MIN_VERSION, MAX_VERSION = 0, 4


async def handle(ctx, request: dict, version: int) -> dict:
    if not ctx.allowed(Operation.READ, ResourceType.GROUP, request["group_id"]):   # Kafka: READ on the group
        return {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}
    err = ctx.broker.groups.heartbeat(
        request["group_id"], member_id=request.get("member_id") or "",
        group_instance_id=request.get("group_instance_id") if version >= 3 else None,
        generation_id=request["generation_id"])
    return {"throttle_time_ms": 0, "error_code": err}
