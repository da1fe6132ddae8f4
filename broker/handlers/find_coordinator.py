"""FindCoordinator (key 10), versions 0-4.

v1 adds key_type (0 group, 1 transaction) and error_message; v3 flexible; v4 batches
several keys (coordinator_keys -> coordinators). A group's coordinator is the leader of
its partition of __consumer_offsets (broker/groups/coordinator.py), the same answer from
every broker; while that partition has no live leader (or, in a new cluster, before
enough brokers registered for the controller to create the topic) the answer is
COORDINATOR_NOT_AVAILABLE, on which clients retry. librdkafka asks even for
assign()-only consumers, so this must always answer.
Transactions are not supported: a transaction coordinator lookup is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal with a clear message
instead of retrying forever.
"""
from broker.groups.offsets_log import OFFSETS_TOPIC, partition_for
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..listeners import request_listener
from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.FIND_COORDINATOR
MIN_VERSION, MAX_VERSION = 0, 4

GROUP, TRANSACTION = 0, 1


def _answer(broker, key_type: int, key: str, listener: str | None) -> dict:
    if key_type != GROUP:
        err = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if key_type == TRANSACTION else ErrorCode.INVALID_REQUEST
        return {"error_code": err, "error_message": "canopy does not support transactions"
                if key_type == TRANSACTION else "unknown key type", "node_id": -1, "host": "", "port": -1}
    topic = broker.topics.get(OFFSETS_TOPIC)
    if topic is None and not broker.cluster.enabled:
        broker.groups.load()
        topic = broker.topics.get(OFFSETS_TOPIC)
    node = topic.partitions[partition_for(key, len(topic.partitions))].leader if topic is not None else -1
    # The coordinator's address on the listener the request came in on (KIP-103).
    b = next((b for b in broker.brokers(listener) if b["node_id"] == node), None)
    if b is None:
        return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "error_message": f"the leader of {OFFSETS_TOPIC} for this group is not available",
                "node_id": -1, "host": "", "port": -1}
    return {"error_code": 0, "error_message": None, "node_id": node, "host": b["host"], "port": b["port"]}


def _checked_answer(ctx, key_type: int, key: str) -> dict:
    # Kafka: DESCRIBE on the group, or on the transactional id.
    if key_type in (GROUP, TRANSACTION) and not ctx.allowed(
            Operation.DESCRIBE, ResourceType.GROUP if key_type == GROUP else ResourceType.TRANSACTIONAL_ID, key):
        return {"error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED if key_type == GROUP
                else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "error_message": "DESCRIBE is needed", "node_id": -1, "host": "", "port": -1}
    return _answer(ctx.broker, key_type, key, request_listener(ctx))


async def handle(ctx, request: dict, version: int) -> dict:
    key_type = request.get("key_type", GROUP)
    if version >= 4:
        return {"throttle_time_ms": 0, "coordinators": [
            {"key": key, **_checked_answer(ctx, key_type, key)} for key in request["coordinator_keys"]]}
    return {"throttle_time_ms": 0, **_checked_answer(ctx, key_type, request["key"])}
