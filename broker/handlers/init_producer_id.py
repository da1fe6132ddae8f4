"""InitProducerId (key 22), versions 0-4.

Idempotence is on by default in kafka-python 3, the Java producer (Spark's sink) and is
optional in librdkafka, so every producer calls this first. v2 flexible; v3 lets a
producer pass its current id/epoch to bump the epoch after an error (KIP-360): the same
id with epoch + 1 (a new id when the epoch would overflow). v4 is the same as v3.
Producer ids are unique in the cluster: each broker reserves blocks of them through etcd
(Kafka's AllocateProducerIds); while etcd cannot be reached for a new block the answer is
COORDINATOR_LOAD_IN_PROGRESS, which producers retry. Transactions are out of scope: a transactional_id is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (fatal in clients, with a clear message).
"""
from controller.etcd import EtcdError
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.INIT_PRODUCER_ID
MIN_VERSION, MAX_VERSION = 0, 4

MAX_EPOCH = 32767


async def handle(ctx, request: dict, version: int) -> dict:
    txn_id = request.get("transactional_id")
    if txn_id is not None:
        # (WRITE on the transactional id is what Kafka checks; refused either way here.)
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if not ctx.may_write_some_topic():
        # Kafka: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on
        # at least one topic (KIP-679).
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    pid, epoch = request.get("producer_id", -1), request.get("producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < MAX_EPOCH - 1:
        return {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": epoch + 1}
    try:
        pid = await ctx.broker.cluster.allocate_producer_id()
    except EtcdError:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}
