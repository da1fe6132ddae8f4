"""AlterPartitionReassignments (key 45), versions 0-1 (always flexible).

canopy uses it for its replication trees: the replica list given is the partition's new
tree in breadth-first order, its first replica the leader. It must be a reordering of the
current replicas (moving data between brokers is not supported). A new first replica is
a promotion: the controller bumps the leader epoch, and the subtree re-homes. This is
what `canopy cluster promote` sends; like Kafka, it is served by the controller, and
other brokers forward it there. v1 adds allow_replication_factor_change (must hold).
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from ..topics import TopicError

API_KEY = ApiKey.ALTER_PARTITION_REASSIGNMENTS
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx, request: dict, version: int) -> dict:
    cluster = ctx.broker.cluster
    if not ctx.allowed(Operation.ALTER, ResourceType.CLUSTER):   # Kafka: ALTER on the cluster
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "ALTER on the cluster is needed", "responses": []}
    if cluster.enabled and not cluster.is_controller:
        return await cluster.forward_to_controller(API_KEY, version, request, lambda msg: {
            "throttle_time_ms": 0, "error_code": ErrorCode.NOT_CONTROLLER, "error_message": msg, "responses": []})
    responses = []
    for t in request["topics"]:
        parts = []
        for pr in t["partitions"]:
            out = {"partition_index": pr["partition_index"], "error_code": 0, "error_message": None}
            if not cluster.enabled:
                out.update(error_code=ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                           error_message="a single-node broker has no replication tree")
            elif pr["replicas"] is None:
                out.update(error_code=ErrorCode.INVALID_REQUEST, error_message="nothing to cancel")
            else:
                try:
                    # `canopy cluster promote` checks the ISR itself (--force overrides).
                    await cluster.controller_call(cluster.controller.set_tree, t["name"], pr["partition_index"],
                                                  list(pr["replicas"]), force=True)
                except TopicError as e:
                    out.update(error_code=e.code, error_message=str(e))
            parts.append(out)
        responses.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": responses}
