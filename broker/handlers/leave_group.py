"""LeaveGroup (key 13), versions 0-5.

v0-2: one member_id, one top-level error. v3 (KIP-345) batches members, each with an
optional group_instance_id (an admin may remove a static member by instance id alone) and a
per-member error; v4 flexible; v5 a reason per member (logged only).
"""
import logging

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.LEAVE_GROUP
MIN_VERSION, MAX_VERSION = 0, 5

log = logging.getLogger("canopy.groups")


async def handle(ctx, request: dict, version: int) -> dict:
    group_id = request["group_id"]
    if not ctx.allowed(Operation.READ, ResourceType.GROUP, group_id):   # Kafka: READ on the group
        return {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "members": []}
    if version < 3:
        members = [(request.get("member_id") or "", None)]
    else:
        members = [(m.get("member_id") or "", m.get("group_instance_id"))
                   for m in request.get("members") or []]
        for m in request.get("members") or []:
            if m.get("reason"):
                log.debug("member %r leaves group %r: %s", m.get("member_id"), group_id, m["reason"])
    results = ctx.broker.groups.leave(group_id, members)
    if version < 3:
        return {"throttle_time_ms": 0, "error_code": results[0][2] if results else ErrorCode.NONE}
    return {"throttle_time_ms": 0, "error_code": 0,
            "members": [{"member_id": mid, "group_instance_id": iid, "error_code": err}
                        for mid, iid, err in results]}
