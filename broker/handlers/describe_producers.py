"""DescribeProducers (key 61), version 0 (flexible).

The idempotent producers a partition leader knows (KIP-664): producer id, epoch, last
sequence and the timestamp of its last batch. canopy has no transactions, so
coordinator_epoch is -1 and current_txn_start_offset -1. Sent to the partition leader;
another broker answers NOT_LEADER_OR_FOLLOWER, an unknown partition
UNKNOWN_TOPIC_OR_PARTITION, as in Kafka.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.DESCRIBE_PRODUCERS
MIN_VERSION, MAX_VERSION = 0, 0


def _partition(registry, name: str, index: int) -> dict:
    out = {"partition_index": index, "error_code": 0, "error_message": None, "active_producers": []}
    p = registry.partition(name, index)
    if p is None or not p.is_replica:
        out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    elif not p.is_leader:
        out["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
    else:
        out["active_producers"] = [
            {"producer_id": pid, "producer_epoch": e.epoch, "last_sequence": e.last_seq,
             "last_timestamp": e.batches[-1].timestamp if e.batches else -1,
             "coordinator_epoch": -1, "current_txn_start_offset": -1}
            for pid, e in sorted(p.producers.entries.items())]
    return out


async def handle(ctx, request: dict, version: int) -> dict:
    registry = ctx.broker.topics
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [_partition(registry, t["name"], i) for i in t["partition_indexes"]]}
        for t in request["topics"]]}
