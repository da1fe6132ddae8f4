"""DescribeConfigs (key 32), versions 1-4.

v1 adds synonyms and config_source (replacing v0's is_default); v3 config_type and
documentation; v4 flexible. Resource types: 2 = topic, 4 = broker. Unknown config names
requested are simply absent, as in Kafka.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

API_KEY = ApiKey.DESCRIBE_CONFIGS
MIN_VERSION, MAX_VERSION = 1, 4

TOPIC, BROKER = 2, 4
SOURCE_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5
# ConfigType enum of DescribeConfigs v3+: STRING 2, INT 3, LONG 5, DOUBLE 6, LIST 7.
_TYPES = {"retention.ms": 5, "retention.bytes": 5, "segment.bytes": 3, "segment.ms": 5,
          "max.message.bytes": 3, "min.insync.replicas": 3, "cleanup.policy": 7,
          "min.cleanable.dirty.ratio": 6, "min.compaction.lag.ms": 5, "max.compaction.lag.ms": 5,
          "delete.retention.ms": 5}


def _entry(name: str, value: str, source: int, include_synonyms: bool) -> dict:
    return {"name": name, "value": value, "read_only": source != SOURCE_TOPIC,
            "is_default": source == SOURCE_DEFAULT, "config_source": source, "is_sensitive": False,
            "synonyms": [{"name": name, "value": value, "source": source}] if include_synonyms else [],
            "config_type": _TYPES.get(name, 2), "documentation": None}


def broker_configs(broker) -> dict[str, str]:
    c = broker.config
    lc = c.listener_config
    return {
        "broker.id": str(c.node_id), "node.id": str(c.node_id),
        "listeners": ",".join(map(str, lc.listeners)),
        "advertised.listeners": ",".join("%s://%s:%d" % (n, *a) for n, a in lc.advertised.items()),
        "listener.security.protocol.map": ",".join(f"{x.name}:{x.security_protocol}" for x in lc.listeners),
        "inter.broker.listener.name": lc.inter_broker,
        "auto.create.topics.enable": str(c.auto_create_topics).lower(),
        "num.partitions": str(c.num_partitions), "log.retention.ms": str(c.log_retention_ms),
        "log.retention.bytes": str(c.log_retention_bytes), "log.segment.bytes": str(c.log_segment_bytes),
        "message.max.bytes": str(c.message_max_bytes), "socket.request.max.bytes": str(c.max_request_bytes),
        "log.cleaner.enable": str(c.log_cleaner_enable).lower(),
        "log.cleaner.backoff.ms": str(c.log_cleaner_backoff_ms),
        "log.cleaner.io.max.bytes.per.second":
            str(c.log_cleaner_io_max_bytes_per_second if c.log_cleaner_io_max_bytes_per_second > 0
                else 1.7976931348623157e308),
        "canopy.flush": c.flush, "broker.rack": c.rack or "",
        # default children per replica of new topics' trees (`canopy cluster describe` reads it)
        "canopy.fanout": str(c.fanout),
    }


# canopy's view of the cluster's metadata store, for `canopy cluster describe`; the health
# entry asks every etcd member, so it is computed only when named explicitly.
STORE_HEALTH = "canopy.metadata.store.health"


async def cluster_configs(broker, keys) -> dict[str, str]:
    cluster = broker.cluster
    if not cluster.enabled:
        return {}
    out = {"canopy.metadata.store": broker.config.metadata_store,
           "canopy.controller.epoch": str(cluster.image.controller_epoch)}
    if keys is not None and STORE_HEALTH in keys:
        members = await cluster.store.health()
        out[STORE_HEALTH] = ", ".join(
            f"{m['endpoint']} " + ("healthy" + (" (raft leader)" if m.get("leader") else "") if m["healthy"]
                                   else f"unhealthy: {m.get('error') or 'no answer'}") for m in members)
    return out


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    synonyms = request.get("include_synonyms", False)
    results = []
    for res in request["resources"]:
        rtype, rname, keys = res["resource_type"], res["resource_name"], res.get("configuration_keys")
        out = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": rname, "configs": []}
        if rtype == TOPIC:
            topic = broker.topics.get(rname)
            if topic is None:
                out.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error_message=f"unknown topic {rname!r}")
            else:
                out["configs"] = [_entry(k, v, SOURCE_DEFAULT if d else SOURCE_TOPIC, synonyms)
                                  for k, (v, d) in sorted(broker.topics.effective_configs(topic).items())
                                  if keys is None or k in keys]
        elif rtype == BROKER:
            if rname not in ("", str(broker.node_id)):
                out.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"broker {rname} is not this broker")
            else:
                configs = {**broker_configs(broker), **await cluster_configs(broker, keys)}
                out["configs"] = [_entry(k, v, SOURCE_STATIC_BROKER, synonyms)
                                  for k, v in sorted(configs.items()) if keys is None or k in keys]
        else:
            out.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"resource type {rtype} not supported")
        results.append(out)
    return {"throttle_time_ms": 0, "results": results}
