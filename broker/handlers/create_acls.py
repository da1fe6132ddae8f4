"""CreateAcls (key 30), versions 1-3.

v1 adds the resource pattern type (KIP-290: LITERAL or PREFIXED); v2 flexible; v3 is the
same as v2. Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED for every creation);
without an authorizer every creation answers SECURITY_DISABLED, as Kafka's. A creation
that is not a concrete binding (ANY/MATCH/UNKNOWN values, an empty name, a principal that
is not TYPE:NAME, a CLUSTER resource not named kafka-cluster) is INVALID_REQUEST on its
own; the valid ones are stored together (broker/security/acl_store.py). Creating a binding
that exists already succeeds and changes nothing.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import AclBinding, InvalidAcl, Operation, ResourceType
from ..security.acl_store import AclStoreError

API_KEY = ApiKey.CREATE_ACLS
MIN_VERSION, MAX_VERSION = 1, 3


async def handle(ctx, request: dict, version: int) -> dict:
    store = ctx.broker.acls
    creations = request.get("creations") or []

    def all_fail(code, message):
        return {"throttle_time_ms": 0, "results": [{"error_code": code, "error_message": message}
                                                   for _ in creations]}
    if not store.enabled:
        return all_fail(ErrorCode.SECURITY_DISABLED, "no authorizer is configured on this broker")
    if not ctx.allowed(Operation.ALTER, ResourceType.CLUSTER):
        return all_fail(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is needed to create ACLs")
    results, valid = [], []
    for c in creations:
        try:
            valid.append(AclBinding.make(c["resource_type"], c["resource_name"], c.get("resource_pattern_type", 3),
                                         c["principal"], c["host"], c["operation"], c["permission_type"]))
            results.append({"error_code": 0, "error_message": None})
        except InvalidAcl as e:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(e)})
    try:
        await store.create(valid)
    except AclStoreError as e:
        for r in results:
            if r["error_code"] == 0:
                r.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=str(e))
    return {"throttle_time_ms": 0, "results": results}
