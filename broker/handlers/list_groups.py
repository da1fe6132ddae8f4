"""ListGroups (key 16), versions 0-4.

v1 throttle time; v3 flexible; v4 states_filter (KIP-518) and group_state per group; an
empty filter means all states. (v5 types_filter: not served.) Groups that only hold
committed offsets are listed as Empty with protocol type "", as Kafka lists them.
"""
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.LIST_GROUPS
MIN_VERSION, MAX_VERSION = 0, 4


async def handle(ctx, request: dict, version: int) -> dict:
    states = {s.lower() for s in request.get("states_filter") or []} if version >= 4 else set()
    # Kafka: everything with DESCRIBE on the cluster, else only the groups the principal
    # may DESCRIBE.
    everything = ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER)
    groups = [g for g in ctx.broker.groups.list_groups()
              if (not states or g.state.lower() in states)
              and (everything or ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, g.group_id))]
    return {"throttle_time_ms": 0, "error_code": 0, "groups": [
        {"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": g.state}
        for g in groups]}
