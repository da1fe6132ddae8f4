"""CreatePartitions (key 37), versions 0-3.

v1 is the same as v0; v2 flexible; v3 the same as v2. The count can only grow
(INVALID_PARTITIONS otherwise); explicit assignments may only name live brokers.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from ..topics import TopicError

API_KEY = ApiKey.CREATE_PARTITIONS
MIN_VERSION, MAX_VERSION = 0, 3


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    # Kafka: ALTER on each topic, checked here before a follower forwards to the controller.
    denied = {t["name"] for t in request["topics"] if not ctx.allowed(Operation.ALTER, ResourceType.TOPIC, t["name"])}
    if denied:
        rest = [t for t in request["topics"] if t["name"] not in denied]
        answered = iter((await handle(ctx, {**request, "topics": rest}, version))["results"] if rest else [])
        return {"throttle_time_ms": 0, "results": [
            {"name": t["name"], "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
             "error_message": "ALTER on the topic is needed"} if t["name"] in denied else next(answered)
            for t in request["topics"]]}
    if broker.cluster.enabled and not broker.cluster.is_controller:
        return await broker.cluster.forward_to_controller(API_KEY, version, request, lambda msg: {
            "throttle_time_ms": 0, "results": [{"name": t["name"], "error_code": ErrorCode.NOT_CONTROLLER,
                                                "error_message": msg} for t in request["topics"]]})
    nodes = {b["node_id"] for b in broker.brokers()}
    results = []
    for t in request["topics"]:
        out = {"name": t["name"], "error_code": 0, "error_message": None}
        assignments = t.get("assignments")
        if assignments and any(n not in nodes for a in assignments for n in a["broker_ids"]):
            out.update(error_code=ErrorCode.INVALID_REPLICA_ASSIGNMENT, error_message="unknown broker in assignment")
        else:
            try:
                if broker.cluster.enabled:
                    await broker.cluster.controller_call(broker.cluster.controller.add_partitions, t["name"],
                                                         t["count"], request.get("validate_only", False))
                else:
                    broker.topics.add_partitions(t["name"], t["count"],
                                                 validate_only=request.get("validate_only", False))
            except TopicError as e:
                out.update(error_code=e.code, error_message=str(e))
        results.append(out)
    return {"throttle_time_ms": 0, "results": results}
