"""FindCoordinator (key 10), versions 0-4.

v1 adds key_type (0 group, 1 transaction) and error_message; v3 flexible; v4 batches
several keys (coordinator_keys -> coordinators). Every group's coordinator is this broker.
librdkafka asks even for assign()-only consumers, so this must always answer.
Transactions are not supported: a transaction coordinator lookup is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal with a clear message
instead of retrying forever.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.FIND_COORDINATOR
MIN_VERSION, MAX_VERSION = 0, 4

GROUP, TRANSACTION = 0, 1


def _answer(broker, key_type: int) -> dict:
    if key_type != GROUP:
        err = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if key_type == TRANSACTION else ErrorCode.INVALID_REQUEST
        return {"error_code": err, "error_message": "canopy does not support transactions"
                if key_type == TRANSACTION else "unknown key type", "node_id": -1, "host": "", "port": -1}
    # One coordinator per group, whichever broker is asked: on a cluster, the controller
    # (its __consumer_offsets log is local to it).
    node = broker.controller_id
    b = next(b for b in broker.brokers() if b["node_id"] == node)
    return {"error_code": 0, "error_message": None, "node_id": node, "host": b["host"], "port": b["port"]}


async def handle(ctx, request: dict, version: int) -> dict:
    key_type = request.get("key_type", GROUP)
    if version >= 4:
        return {"throttle_time_ms": 0, "coordinators": [
            {"key": key, **_answer(ctx.broker, key_type)} for key in request["coordinator_keys"]]}
    return {"throttle_time_ms": 0, **_answer(ctx.broker, key_type)}
