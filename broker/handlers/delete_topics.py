"""DeleteTopics (key 20), versions 1-6.

v4 flexible; v5 error_message; v6 names topics by name or id (`topics`) instead of
`topic_names`. Deleting removes the partition directories; long-polling fetches on the
topic are woken and answer UNKNOWN_TOPIC_OR_PARTITION from then on.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.schema import ZERO_UUID

from ..security.acl import Operation, ResourceType
from ..topics import INTERNAL_TOPICS, TopicError

API_KEY = ApiKey.DELETE_TOPICS
MIN_VERSION, MAX_VERSION = 1, 6


async def _cluster_delete(ctx, request: dict, version: int) -> dict:
    cluster = ctx.broker.cluster
    if not cluster.is_controller:
        names = ([t.get("name") for t in request["topics"]] if version >= 6 else request["topic_names"])
        return await cluster.forward_to_controller(API_KEY, version, request, lambda msg: {
            "throttle_time_ms": 0, "responses": [{"name": n, "error_code": ErrorCode.NOT_CONTROLLER,
                                                  "error_message": msg} for n in names]})
    wanted = ([(t.get("name"), t.get("topic_id")) for t in request["topics"]] if version >= 6
              else [(n, None) for n in request["topic_names"]])
    responses = []
    for name, topic_id in wanted:
        if name is None:
            name = next((t.name for t in cluster.image.topics.values() if t.topic_id == topic_id), None)
        out = {"name": name, "topic_id": topic_id or ZERO_UUID, "error_code": 0, "error_message": None}
        try:
            if name is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_ID, "unknown topic id")
            await cluster.controller_call(cluster.controller.delete_topic, name)
            await ctx.broker.groups.forget_topic(name)
        except TopicError as e:
            out["error_code"], out["error_message"] = e.code, str(e)
        responses.append(out)
    return {"throttle_time_ms": 0, "responses": responses}


def _name_of(ctx, entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if entry.get("name") is not None:
        return entry["name"]
    b = ctx.broker
    found = (next((t.name for t in b.cluster.image.topics.values() if t.topic_id == entry.get("topic_id")), None)
             if b.cluster.enabled else getattr(b.topics.by_id.get(entry.get("topic_id")), "name", None))
    return found


async def handle(ctx, request: dict, version: int) -> dict:
    # Kafka: DELETE on each topic (TOPIC_AUTHORIZATION_FAILED, also for a topic that does
    # not exist, so existence does not leak). Checked before forwarding to the controller.
    field = "topics" if version >= 6 else "topic_names"
    entries = request[field]
    denied = [(n := _name_of(ctx, e)) is not None and not ctx.allowed(Operation.DELETE, ResourceType.TOPIC, n)
              for e in entries]
    if not any(denied):
        return await _handle(ctx, request, version)
    rest = [e for e, d in zip(entries, denied) if not d]
    answered = iter((await _handle(ctx, {**request, field: rest}, version))["responses"] if rest else [])
    return {"throttle_time_ms": 0, "responses": [
        {"name": e if isinstance(e, str) else e.get("name"),
         "topic_id": (e.get("topic_id") if not isinstance(e, str) else None) or ZERO_UUID,
         "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "error_message": "DELETE on the topic is needed"}
        if d else next(answered) for e, d in zip(entries, denied)]}


async def _handle(ctx, request: dict, version: int) -> dict:
    if ctx.broker.cluster.enabled:
        return await _cluster_delete(ctx, request, version)
    registry = ctx.broker.topics
    if version >= 6:
        wanted = [(t.get("name"), t.get("topic_id")) for t in request["topics"]]
    else:
        wanted = [(n, None) for n in request["topic_names"]]
    responses = []
    for name, topic_id in wanted:
        topic = registry.get(name) if name is not None else registry.by_id.get(topic_id)
        out = {"name": name, "topic_id": topic_id or ZERO_UUID, "error_code": 0, "error_message": None}
        if topic is None:
            out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None else ErrorCode.UNKNOWN_TOPIC_ID
        elif topic.name in INTERNAL_TOPICS:
            out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            out["error_message"] = "internal topics cannot be deleted"
        else:
            out["name"], out["topic_id"] = topic.name, topic.topic_id
            try:
                registry.delete(topic.name)
            except TopicError as e:
                out["error_code"], out["error_message"] = e.code, str(e)
            else:
                # Kafka drops a deleted topic's committed offsets too; a topic re-created
                # under the same name must not resume from the old one's offsets.
                await ctx.broker.groups.forget_topic(topic.name)
        responses.append(out)
    return {"throttle_time_ms": 0, "responses": responses}
