"""JoinGroup (key 11), versions 0-9.

v1 adds rebalance_timeout_ms (v0: the session timeout serves as both); v2 throttle time;
v4 KIP-394: a member joining with an empty member id gets MEMBER_ID_REQUIRED (79) with a
generated id and must rejoin with it; v5 group_instance_id (static membership, KIP-345);
v6 flexible; v7 protocol_type in the response and protocol_name nullable; v8 reason
(logged only); v9 skip_assignment (KIP-814, only for the new KRaft-side static-member
path; canopy always sends false and the members to the leader).

The response is held until the join phase of the rebalance completes (all known members
rejoined, or the rebalance timeout elapsed). Only the leader receives the member list.
"""
import logging

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from ._group_common import client_host, client_id

API_KEY = ApiKey.JOIN_GROUP
MIN_VERSION, MAX_VERSION = 0, 9

log = logging.getLogger("canopy.groups")


async def handle(ctx, request: dict, version: int) -> dict:
    if not ctx.allowed(Operation.READ, ResourceType.GROUP, request["group_id"]):   # Kafka: READ on the group
        return {"throttle_time_ms": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "generation_id": -1,
                "protocol_type": None, "protocol_name": None if version >= 7 else "", "leader": "",
                "skip_assignment": False, "member_id": request.get("member_id") or "", "members": []}
    if version >= 8 and request.get("reason"):
        log.debug("member %r joins group %r: %s", request.get("member_id"), request["group_id"],
                  request["reason"])
    r = await ctx.broker.groups.join(
        request["group_id"],
        member_id=request.get("member_id") or "",
        group_instance_id=request.get("group_instance_id") if version >= 5 else None,
        client_id=client_id(ctx), client_host=client_host(ctx),
        session_timeout_ms=request["session_timeout_ms"],
        rebalance_timeout_ms=request.get("rebalance_timeout_ms", -1) if version >= 1 else -1,
        protocol_type=request.get("protocol_type") or "",
        protocols=[(p["name"], p["metadata"]) for p in request.get("protocols") or []],
        require_known_member_id=version >= 4)
    protocol_name = r.protocol_name
    if protocol_name is None and version < 7:
        protocol_name = ""  # not nullable before v7
    return {
        "throttle_time_ms": 0, "error_code": r.error, "generation_id": r.generation_id,
        "protocol_type": r.protocol_type, "protocol_name": protocol_name,
        "leader": r.leader or "", "skip_assignment": False, "member_id": r.member_id or "",
        "members": [{"member_id": mid, "group_instance_id": iid, "metadata": md}
                    for mid, iid, md in r.members],
    }
