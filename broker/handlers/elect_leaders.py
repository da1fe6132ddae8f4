"""ElectLeaders (key 43), versions 0-2.

v0 is always a preferred election; v1 adds election_type (0 preferred, 1 unclean) and a
top-level error code; v2 flexible. ``topic_partitions`` null means every partition.
Per partition, as Kafka answers: ELECTION_NOT_NEEDED when the wanted leader already
leads (preferred) or the leader is alive (unclean), PREFERRED_LEADER_NOT_AVAILABLE when
the preferred replica is not live and in the ISR, ELIGIBLE_LEADERS_NOT_AVAILABLE when no
live replica can lead, UNKNOWN_TOPIC_OR_PARTITION. Elections are the controller's (other
brokers forward the request); a single broker leads every partition itself, so nothing is
ever needed there. The preferred replica is defined in replication.tree.preferred_leader.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..topics import TopicError

API_KEY = ApiKey.ELECT_LEADERS
MIN_VERSION, MAX_VERSION = 0, 2

PREFERRED, UNCLEAN = 0, 1


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    cluster = broker.cluster
    if cluster.enabled and not cluster.is_controller:
        return await cluster.forward_to_controller(API_KEY, version, request, lambda msg: {
            "throttle_time_ms": 0, "error_code": ErrorCode.NOT_CONTROLLER, "replica_election_results": []})
    etype = request.get("election_type", PREFERRED) if version >= 1 else PREFERRED
    if etype not in (PREFERRED, UNCLEAN):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "replica_election_results": []}
    wanted = request.get("topic_partitions")
    if wanted is None:
        names = sorted(cluster.image.topics) if cluster.enabled else sorted(broker.topics.topics)
        wanted = []
        for n in names:
            count = len(cluster.image.topics[n].partitions) if cluster.enabled else len(broker.topics.get(n).partitions)
            wanted.append({"topic": n, "partitions": list(range(count))})
    results = []
    for w in wanted:
        parts = []
        for i in w["partitions"]:
            out = {"partition_id": i, "error_code": 0, "error_message": None}
            if not cluster.enabled:
                if broker.topics.partition(w["topic"], i) is None:
                    out.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               error_message=f"unknown partition {w['topic']}-{i}")
                else:
                    out.update(error_code=ErrorCode.ELECTION_NOT_NEEDED,
                               error_message="a single broker leads every partition")
            else:
                try:
                    await cluster.controller_call(cluster.controller.elect_leader, w["topic"], i, etype == UNCLEAN)
                except TopicError as e:
                    out.update(error_code=e.code, error_message=str(e))
            parts.append(out)
        results.append({"topic": w["topic"], "partition_result": parts})
    return {"throttle_time_ms": 0, "error_code": 0, "replica_election_results": results}
