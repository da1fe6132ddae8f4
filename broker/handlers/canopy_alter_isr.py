"""CanopyAlterIsr (canopy-internal key 10001), version 0; never advertised.

A partition leader reports its in-sync replicas to the controller, which records them in
the metadata log (Kafka's leaders do the same with AlterPartition, API 56). Schema:
protocol/schemas/CanopyAlterIsr*.json.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.CANOPY_ALTER_ISR
MIN_VERSION, MAX_VERSION = 0, 0
ADVERTISED = False


async def handle(ctx, request: dict, version: int) -> dict:
    cluster = ctx.broker.cluster
    if not cluster.enabled or not cluster.is_controller:
        return {"error_code": ErrorCode.NOT_CONTROLLER, "topics": []}
    return cluster.alter_isr(request)
