"""DescribeAcls (key 29), versions 1-3.

v1 adds the pattern type filter (KIP-290: PREFIXED patterns); v2 flexible; v3 is the same
as v2 (KIP-373 user resources). Needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED);
without an authorizer the answer is SECURITY_DISABLED, as Kafka's. The filter's ANY and
MATCH work as in Kafka (broker/security/acl.py AclFilter); a filter with an UNKNOWN
element is INVALID_REQUEST. Bindings are grouped by resource pattern.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import AclFilter, InvalidAcl, Operation, ResourceType

API_KEY = ApiKey.DESCRIBE_ACLS
MIN_VERSION, MAX_VERSION = 1, 3


def _error(code: int, message: str) -> dict:
    return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "resources": []}


async def handle(ctx, request: dict, version: int) -> dict:
    store = ctx.broker.acls
    if not store.enabled:
        return _error(ErrorCode.SECURITY_DISABLED, "no authorizer is configured on this broker")
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER):
        return _error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "DESCRIBE on the cluster is needed to list ACLs")
    try:
        flt = AclFilter.make(request["resource_type_filter"], request.get("resource_name_filter"),
                             request.get("pattern_type_filter", 3), request.get("principal_filter"),
                             request.get("host_filter"), request["operation"], request["permission_type"])
    except InvalidAcl as e:
        return _error(ErrorCode.INVALID_REQUEST, str(e))
    resources: dict[tuple, list] = {}
    for b in store.describe(flt):
        resources.setdefault((b.resource_type, b.name, b.pattern_type), []).append(
            {"principal": b.principal, "host": b.host, "operation": int(b.operation),
             "permission_type": int(b.permission)})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": [
        {"resource_type": int(rt), "resource_name": name, "pattern_type": int(pt), "acls": acls}
        for (rt, name, pt), acls in resources.items()]}
