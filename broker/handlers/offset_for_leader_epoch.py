"""OffsetForLeaderEpoch (key 23), versions 2-4.

v2 adds current_leader_epoch (fencing, KIP-320); v3 replica_id (-2 = debugging consumer);
v4 flexible. A returning replica asks where its log diverged: for the epoch it last
wrote, the answer is the largest epoch <= it that this replica knows and the offset where
the next epoch began (or the log end for the current epoch) — Kafka's
LeaderEpochFileCache.endOffsetFor. Offered only because replication truncates with it;
a moving epoch makes clients call it too (KIP-320), to detect truncation.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from .fetch import check_leader_epoch

API_KEY = ApiKey.OFFSET_FOR_LEADER_EPOCH
MIN_VERSION, MAX_VERSION = 2, 4


async def handle(ctx, request: dict, version: int) -> dict:
    registry = ctx.broker.topics
    replica_id = request.get("replica_id", -1)
    topics = []
    # Kafka: a replica needs CLUSTER_ACTION on the cluster, a consumer DESCRIBE on the topic.
    replica_allowed = replica_id < 0 or ctx.allowed(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    for t in request["topics"]:
        denied = not replica_allowed or (replica_id < 0 and not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC,
                                                                            t["topic"]))
        parts = []
        for pr in t["partitions"]:
            idx = pr["partition"]
            out = {"error_code": 0, "partition": idx, "leader_epoch": -1, "end_offset": -1}
            p = registry.partition(t["topic"], idx)
            if denied:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif p is None or not p.is_replica:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif (replica_id < 0 and replica_id != -2 and not p.is_leader) or p.fenced:
                # (a fenced former leader's log must not decide where followers truncate)
                out["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                err = check_leader_epoch(p, pr.get("current_leader_epoch", -1))
                if err:
                    out["error_code"] = err
                else:
                    out["leader_epoch"], out["end_offset"] = p.end_offset_for_epoch(pr["leader_epoch"])
            parts.append(out)
        topics.append({"topic": t["topic"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
