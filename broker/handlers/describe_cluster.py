"""DescribeCluster (key 60), versions 0-1 (always flexible).

v1 adds endpoint_type (1 = brokers; 2 = controllers, which canopy does not expose
separately, so it is answered with the brokers too). Brokers are listed with their
endpoints on the listener the request arrived on. include_cluster_authorized_operations gets
Kafka's bit set (every cluster operation without an authorizer); Kafka asks no permission
for the rest."""
from protocol.messages import ApiKey

from ..listeners import request_listener
from ..security.acl import ResourceType

API_KEY = ApiKey.DESCRIBE_CLUSTER
MIN_VERSION, MAX_VERSION = 0, 1


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    return {
        "throttle_time_ms": 0, "error_code": 0, "error_message": None,
        "endpoint_type": request.get("endpoint_type", 1),
        "cluster_authorized_operations": ctx.authorized_operations(ResourceType.CLUSTER)
        if request.get("include_cluster_authorized_operations") else -2147483648,
        "cluster_id": broker.config.cluster_id,
        "controller_id": await broker.cluster.elected_controller(),
        "brokers": [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"]}
                    for b in broker.brokers(request_listener(ctx))],
    }
