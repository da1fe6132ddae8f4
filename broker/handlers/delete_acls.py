"""DeleteAcls (key 31), versions 1-3.

v1 adds the pattern type filter (KIP-290); v2 flexible; v3 is the same as v2. Needs
ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED for every filter); without an
authorizer each filter answers SECURITY_DISABLED, as Kafka's. Each filter deletes every
binding it matches (ANY/MATCH as in Kafka, broker/security/acl.py AclFilter) and lists
them; a filter with an UNKNOWN element is INVALID_REQUEST on its own.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import AclFilter, InvalidAcl, Operation, ResourceType
from ..security.acl_store import AclStoreError

API_KEY = ApiKey.DELETE_ACLS
MIN_VERSION, MAX_VERSION = 1, 3


def _result(code: int = 0, message: str | None = None, matching=()) -> dict:
    return {"error_code": code, "error_message": message, "matching_acls": [
        {"error_code": 0, "error_message": None, **b.to_wire()} for b in matching]}


async def handle(ctx, request: dict, version: int) -> dict:
    store = ctx.broker.acls
    filters = request.get("filters") or []
    if not store.enabled:
        return {"throttle_time_ms": 0, "filter_results": [
            _result(ErrorCode.SECURITY_DISABLED, "no authorizer is configured on this broker") for _ in filters]}
    if not ctx.allowed(Operation.ALTER, ResourceType.CLUSTER):
        return {"throttle_time_ms": 0, "filter_results": [
            _result(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is needed to delete ACLs")
            for _ in filters]}
    parsed: list[AclFilter | str] = []
    for f in filters:
        try:
            parsed.append(AclFilter.make(f["resource_type_filter"], f.get("resource_name_filter"),
                                         f.get("pattern_type_filter", 3), f.get("principal_filter"),
                                         f.get("host_filter"), f["operation"], f["permission_type"]))
        except InvalidAcl as e:
            parsed.append(str(e))
    valid = [f for f in parsed if not isinstance(f, str)]
    try:
        matched = iter(await store.delete(valid))
    except AclStoreError as e:
        return {"throttle_time_ms": 0, "filter_results": [
            _result(ErrorCode.INVALID_REQUEST, f) if isinstance(f, str)
            else _result(ErrorCode.UNKNOWN_SERVER_ERROR, str(e)) for f in parsed]}
    return {"throttle_time_ms": 0, "filter_results": [
        _result(ErrorCode.INVALID_REQUEST, f) if isinstance(f, str) else _result(matching=next(matched))
        for f in parsed]}
