"""DescribeGroups (key 15), versions 0-5.

v1 throttle time; v3 include_authorized_operations (Kafka's bit set when asked for,
-2147483648 "not provided" otherwise); a group the principal may not DESCRIBE answers
GROUP_AUTHORIZATION_FAILED; v4 group_instance_id per member; v5 flexible. (v6 adds an
error message: not served.)

State names are Kafka's: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead (an
unknown group is Dead with no error, as in Kafka). Member metadata, assignments and the
protocol name are only filled in while the group is Stable, as Kafka does.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.DESCRIBE_GROUPS
MIN_VERSION, MAX_VERSION = 0, 5

AUTHORIZED_OPERATIONS_OMITTED = -2147483648


async def handle(ctx, request: dict, version: int) -> dict:
    coord = ctx.broker.groups
    out = []
    ask = version >= 3 and request.get("include_authorized_operations")
    for gid in request.get("groups") or []:
        err = (ErrorCode.GROUP_AUTHORIZATION_FAILED if not ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, gid)
               else coord.coordinator_error(gid))
        if err:
            out.append({"error_code": err, "group_id": gid, "group_state": "", "protocol_type": "",
                        "protocol_data": "", "members": [], "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
        else:
            out.append({"error_code": 0, **coord.describe(gid), "authorized_operations":
                        ctx.authorized_operations(ResourceType.GROUP, gid) if ask else AUTHORIZED_OPERATIONS_OMITTED})
    return {"throttle_time_ms": 0, "groups": out}
