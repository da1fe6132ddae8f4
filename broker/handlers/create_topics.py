"""CreateTopics (key 19), versions 0-7.

v0 has no validate_only (segmentio/kafka-go 0.2 sends v0; Kafka 3.x serves it, 4.0 removed
v0-1 in KIP-896); v1+ validate_only and error_message; v5 flexible and the response echoes partitions,
replication factor and configs; v7 topic_id. num_partitions / replication_factor of -1
mean the broker default. A replication factor above the number of brokers is
INVALID_REPLICATION_FACTOR, as in Kafka. Kafka sends this to the controller; on a single
node that is this broker.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.schema import ZERO_UUID

from ..security.acl import Operation, ResourceType
from ..topics import TopicError

API_KEY = ApiKey.CREATE_TOPICS
MIN_VERSION, MAX_VERSION = 0, 7


def _create_one(broker, t: dict, validate_only: bool) -> dict:
    name = t["name"]
    out = {"name": name, "topic_id": ZERO_UUID, "error_code": 0, "error_message": None,
           "num_partitions": -1, "replication_factor": -1, "configs": None}
    num = t["num_partitions"]
    rf = t["replication_factor"]
    assignments = t.get("assignments") or []
    if assignments:
        if num != -1 or rf != -1:
            return {**out, "error_code": ErrorCode.INVALID_REQUEST,
                    "error_message": "give either assignments or num_partitions/replication_factor"}
        nodes = {b["node_id"] for b in broker.brokers()}
        for a in assignments:
            if any(n not in nodes for n in a["broker_ids"]) or len(set(a["broker_ids"])) != len(a["broker_ids"]):
                return {**out, "error_code": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        "error_message": f"assignment {a['broker_ids']} names unknown brokers"}
        num = len(assignments)
        rf = len(assignments[0]["broker_ids"])
    if num == -1:
        num = broker.config.num_partitions
    if rf == -1:
        rf = 1
    if rf < 1 or rf > len(broker.brokers()):
        return {**out, "error_code": ErrorCode.INVALID_REPLICATION_FACTOR,
                "error_message": f"replication factor {rf} with {len(broker.brokers())} broker(s)"}
    configs = {c["name"]: c["value"] for c in t.get("configs") or []}
    try:
        topic = broker.topics.create(name, num, configs, validate_only=validate_only)
    except TopicError as e:
        return {**out, "error_code": e.code, "error_message": str(e)}
    out.update(num_partitions=num, replication_factor=rf)
    if topic is not None:
        out["topic_id"] = topic.topic_id
        out["configs"] = [{"name": k, "value": r.value, "read_only": False, "config_source": r.source,
                           "is_sensitive": False}
                          for k, r in broker.topics.effective_configs(topic).items()]
    return out


async def _cluster_create(broker, request: dict, version: int) -> dict:
    """On a cluster, topics are decided by the controller (Kafka forwards CreateTopics to
    it too); any broker accepts the request and relays the controller's answer."""
    cluster = broker.cluster
    if not cluster.is_controller:
        return await cluster.forward_to_controller(API_KEY, version, request, lambda msg: {
            "throttle_time_ms": 0, "topics": [{"name": t["name"], "error_code": ErrorCode.NOT_CONTROLLER,
                                               "error_message": msg} for t in request["topics"]]})
    results = []
    for t in request["topics"]:
        out = {"name": t["name"], "topic_id": ZERO_UUID, "error_code": 0, "error_message": None,
               "num_partitions": -1, "replication_factor": -1, "configs": None}
        num = t["num_partitions"] if t["num_partitions"] != -1 else broker.config.num_partitions
        if t.get("assignments"):
            num = len(t["assignments"])
        try:
            img = await cluster.controller_call(
                cluster.controller.create_topic, t["name"], num,
                t["replication_factor"] if not t.get("assignments") else len(t["assignments"][0]["broker_ids"]),
                {c["name"]: c["value"] for c in t.get("configs") or []},
                validate_only=request.get("validate_only", False))
        except TopicError as e:
            out.update(error_code=e.code, error_message=str(e))
        else:
            out["num_partitions"] = num
            if img is not None:
                out.update(topic_id=img.topic_id, replication_factor=len(img.partitions[0].replicas))
        results.append(out)
    return {"throttle_time_ms": 0, "topics": results}


async def handle(ctx, request: dict, version: int) -> dict:
    # Kafka: CREATE on the cluster, or else on each topic. Checked here, before a
    # follower forwards the request (the controller sees the broker's principal).
    if ctx.allowed(Operation.CREATE, ResourceType.CLUSTER):
        return await _handle(ctx, request, version)
    denied = {t["name"] for t in request["topics"] if not ctx.allowed(Operation.CREATE, ResourceType.TOPIC, t["name"])}
    rest = [t for t in request["topics"] if t["name"] not in denied]
    answered = iter((await _handle(ctx, {**request, "topics": rest}, version))["topics"] if rest else [])
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "topic_id": ZERO_UUID, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
         "error_message": "CREATE on the topic or the cluster is needed", "num_partitions": -1,
         "replication_factor": -1, "configs": None} if t["name"] in denied else next(answered)
        for t in request["topics"]]}


async def _handle(ctx, request: dict, version: int) -> dict:
    if ctx.broker.cluster.enabled:
        return await _cluster_create(ctx.broker, request, version)
    validate_only = request.get("validate_only", False)
    seen = set()
    results = []
    for t in request["topics"]:
        if t["name"] in seen:
            results.append({"name": t["name"], "error_code": ErrorCode.INVALID_REQUEST,
                            "error_message": "topic named twice in one request"})
            continue
        seen.add(t["name"])
        results.append(_create_one(ctx.broker, t, validate_only))
    return {"throttle_time_ms": 0, "topics": results}
