"""DescribeConfigs (key 32), versions 1-4.

v1 adds synonyms and config_source (replacing v0's is_default); v3 config_type and
documentation; v4 flexible. Resource types: 2 = topic, 4 = broker. Unknown config names
requested are simply absent, as in Kafka.

A topic shows every Kafka topic config (broker/topic_configs.py), each with where its
value comes from: TOPIC_CONFIG (1) for an override, DYNAMIC_BROKER_CONFIG (2) /
DYNAMIC_DEFAULT_BROKER_CONFIG (3) when AlterConfigs set the broker's default,
STATIC_BROKER_CONFIG (4) for canopy's own settings, DEFAULT_CONFIG (5, is_default) for
Kafka's default; synonyms list that chain when asked. A broker shows its settings
(read-only: static) and the dynamic configs AlterConfigs may change.
"""
from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from ..security.acl import Operation, ResourceType
from .. import topic_configs as tc

API_KEY = ApiKey.DESCRIBE_CONFIGS
MIN_VERSION, MAX_VERSION = 1, 4

TOPIC, BROKER = 2, 4


def _entry(name: str, r: tc.Resolved, config_type: int, read_only: bool, include_synonyms: bool,
           documentation: str | None = None) -> dict:
    return {"name": name, "value": r.value, "read_only": read_only,
            "is_default": r.source == tc.SOURCE_DEFAULT, "config_source": r.source, "is_sensitive": False,
            "synonyms": [{"name": n, "value": v, "source": src} for n, v, src in r.synonyms]
            if include_synonyms else [],
            "config_type": config_type, "documentation": documentation}


def topic_entries(broker, topic, keys, include_synonyms: bool, include_documentation: bool = False) -> list:
    out = []
    for name, r in broker.topics.effective_configs(topic).items():
        if keys is not None and name not in keys:
            continue
        c = tc.TOPIC_CONFIGS[name]
        if name == "replication.fanout" and name not in topic.configs and broker.cluster.enabled:
            # Without an override the trees were laid out with the controller's canopy.fanout
            # at creation, which the topic's metadata records (this broker's may differ).
            img = broker.cluster.image.topics.get(topic.name)
            if img is not None:
                v = str(img.fanout)
                src = tc.SOURCE_DEFAULT if v == c.default else tc.SOURCE_STATIC_BROKER
                r = tc.Resolved(v, src, [("canopy.fanout", v, src)])
        doc = None
        if include_documentation:
            doc = c.doc or None
            if not c.acted:
                doc = ("accepted and stored; canopy does not act on it" + (f" ({c.doc})" if c.doc else ""))
        out.append(_entry(name, r, c.type, False, include_synonyms, doc))
    return out


def _static_entry(name: str, value: str, include_synonyms: bool) -> dict:
    r = tc.Resolved(value, tc.SOURCE_STATIC_BROKER, [(name, value, tc.SOURCE_STATIC_BROKER)])
    return _entry(name, r, tc.STRING, True, include_synonyms)


def dynamic_broker_entries(broker, keys, include_synonyms: bool) -> dict[str, dict]:
    """The broker configs AlterConfigs can change, resolved like Kafka's: this broker's
    dynamic value, the cluster-wide dynamic default, the static setting, Kafka's default."""
    from ..config_admin import current_broker_configs
    own = current_broker_configs(broker, str(broker.node_id))
    default = current_broker_configs(broker, "default")
    static = tc.static_broker_values(broker.config)
    out = {}
    for bname, c in tc.DYNAMIC_BROKER_CONFIGS.items():
        if keys is not None and bname not in keys:
            continue
        syn = []
        if bname in own:
            syn.append((bname, own[bname], tc.SOURCE_DYNAMIC_BROKER))
        if bname in default:
            syn.append((bname, default[bname], tc.SOURCE_DYNAMIC_DEFAULT_BROKER))
        if bname in static and static[bname] != c.default:
            syn.append((bname, static[bname], tc.SOURCE_STATIC_BROKER))
        syn.append((bname, c.default, tc.SOURCE_DEFAULT))
        out[bname] = _entry(bname, tc.Resolved(syn[0][1], syn[0][2], syn), c.type, False, include_synonyms)
    return out


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
        # Kafka: DESCRIBE_CONFIGS on the topic, or on the cluster for a broker's configs.
        if rtype == TOPIC and not ctx.allowed(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, rname):
            out.update(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message="DESCRIBE_CONFIGS is needed")
        elif rtype == BROKER and not ctx.allowed(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
            out.update(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message="DESCRIBE_CONFIGS is needed")
        elif rtype == TOPIC:
            topic = broker.topics.get(rname)
            if topic is None:
                out.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error_message=f"unknown topic {rname!r}")
            else:
                out["configs"] = topic_entries(broker, topic, keys, synonyms,
                                               request.get("include_documentation", False))
        elif rtype == BROKER:
            if rname not in ("", str(broker.node_id)):
                out.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"broker {rname} is not this broker")
            else:
                configs = {**broker_configs(broker), **await cluster_configs(broker, keys)}
                entries = {k: _static_entry(k, v, synonyms) for k, v in configs.items()
                           if keys is None or k in keys}
                entries.update(dynamic_broker_entries(broker, keys, synonyms))
                out["configs"] = [entries[k] for k in sorted(entries)]
        else:
            out.update(error_code=ErrorCode.INVALID_REQUEST, error_message=f"resource type {rtype} not supported")
        results.append(out)
    return {"throttle_time_ms": 0, "results": results}
