"""AlterConfigs and IncrementalAlterConfigs: the rules both handlers share.

Topic configs are a topic's overrides (broker/topic_configs.py validates them); broker
configs are the *dynamic* broker configs, Kafka's way to change a running broker: a
resource named with a node id is that broker's, the empty name (Kafka's "cluster
default") every broker's. Only the broker configs canopy acts on and Kafka lets change at
run time are accepted (topic_configs.DYNAMIC_BROKER_CONFIGS); Kafka's static ones are
refused with Kafka's answer (INVALID_REQUEST, "Cannot update these configs dynamically").

Where they live: a single broker keeps topic overrides in topic.json and dynamic broker
configs in ``<data-dir>/dynamic_broker_configs.json``; a cluster keeps both in etcd
(/canopy/topics/<name>, /canopy/broker_configs/<id|default>), written by the controller
(other brokers forward the request, as Kafka forwards it to its controller), and every
broker applies them from its watch.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from controller.image import DEFAULT_BROKER_CONFIGS
from protocol.errors import ErrorCode
from storage import replace_durably

from . import topic_configs as tc
from .topics import TopicError

log = logging.getLogger("canopy.configs")

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3   # IncrementalAlterConfigs' config_operation

DYNAMIC_FILE = "dynamic_broker_configs.json"

# Broker configs Kafka only reads at start (canopy's DescribeConfigs shows them): refused
# as Kafka refuses them. Anything else unknown is refused as unknown.
STATIC_BROKER_CONFIGS = frozenset({
    "broker.id", "node.id", "listeners", "advertised.listeners", "listener.security.protocol.map",
    "inter.broker.listener.name", "auto.create.topics.enable", "num.partitions", "socket.request.max.bytes",
    "broker.rack", "log.dirs", "log.dir", "zookeeper.connect", "process.roles", "controller.quorum.voters",
    "default.replication.factor", "offsets.topic.replication.factor", "offsets.topic.num.partitions",
    "canopy.flush", "canopy.fanout", "log.roll.hours", "log.retention.hours", "log.retention.minutes",
})


class AlterError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# -- computing the new set ------------------------------------------------------------------

def _list_value(c: tc.TopicConfig, current: dict[str, str], inherited: str) -> list[str]:
    v = current.get(c.name, inherited)
    return [x.strip() for x in v.split(",") if x.strip()] if v else []


def new_topic_configs(current: dict[str, str], changes: list[dict], incremental: bool,
                      inherited=lambda name: "") -> dict[str, str]:
    """A topic's overrides after the request. AlterConfigs replaces the whole set (what it
    does not name returns to the default, as in Kafka); IncrementalAlterConfigs applies
    SET / DELETE / APPEND / SUBTRACT one by one. Raises AlterError."""
    new = {} if not incremental else dict(current)
    for ch in changes:
        name, value = ch["name"], ch.get("value")
        c = tc.TOPIC_CONFIGS.get(name)
        if c is None:
            raise AlterError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {name}")
        op = ch.get("config_operation", SET) if incremental else SET
        if op == SET:
            if value is None and not incremental:
                new.pop(name, None)   # AlterConfigs with a null value: back to the default
                continue
            new[name] = value
        elif op == DELETE:
            new.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if c.type != tc.LIST:
                verb = "append" if op == APPEND else "subtract"
                raise AlterError(ErrorCode.INVALID_CONFIG,
                                 f"Config value {verb} is not allowed for config key: {name}")
            items = _list_value(c, new, inherited(name))
            given = [x.strip() for x in (value or "").split(",") if x.strip()]
            if op == APPEND:
                items += [x for x in given if x not in items]
            else:
                items = [x for x in items if x not in given]
            new[name] = ",".join(items)
        else:
            raise AlterError(ErrorCode.INVALID_REQUEST, f"unknown config operation {op} for {name}")
    try:
        tc.validate(new)
    except tc.ConfigError as e:
        raise AlterError(e.code, str(e)) from None
    for name in set(new) | set(current):
        c = tc.TOPIC_CONFIGS.get(name)
        if c is not None and not c.alterable and new.get(name) != current.get(name):
            raise AlterError(ErrorCode.INVALID_CONFIG,
                             f"{name} is fixed when the topic is created (its replication trees are laid out then)")
    return new


def new_broker_configs(resource: str, current: dict[str, str], changes: list[dict], incremental: bool) -> dict:
    new = {} if not incremental else dict(current)
    static = [ch["name"] for ch in changes if ch["name"] not in tc.DYNAMIC_BROKER_CONFIGS
              and ch["name"] in STATIC_BROKER_CONFIGS]
    if static:
        # Kafka's DynamicBrokerConfig refuses these; the admin client sees InvalidRequestException.
        raise AlterError(ErrorCode.INVALID_REQUEST,
                         f"Invalid config value for resource ConfigResource(type=BROKER, name='{resource}'): "
                         f"Cannot update these configs dynamically: Set({', '.join(static)})")
    for ch in changes:
        name, value = ch["name"], ch.get("value")
        c = tc.DYNAMIC_BROKER_CONFIGS.get(name)
        if c is None:
            raise AlterError(ErrorCode.INVALID_CONFIG,
                             f"Unknown broker config name: {name} (canopy changes only "
                             f"{', '.join(sorted(tc.DYNAMIC_BROKER_CONFIGS))} at run time)")
        op = ch.get("config_operation", SET) if incremental else SET
        if op == DELETE or (op == SET and value is None):
            new.pop(name, None)
            continue
        if op != SET:
            raise AlterError(ErrorCode.INVALID_CONFIG,
                             f"Config value {'append' if op == APPEND else 'subtract'} is not allowed "
                             f"for config key: {name}")
        try:
            c.parse(value)
        except tc.ConfigError as e:
            raise AlterError(ErrorCode.INVALID_CONFIG, str(e).replace(f"configuration {c.name}",
                                                                      f"configuration {name}")) from None
        new[name] = value.strip()
    return new


def broker_resource_key(broker, name: str) -> str:
    """The stored key of a BROKER resource: "default" for Kafka's empty name, else the id."""
    if name == "":
        return DEFAULT_BROKER_CONFIGS
    if not name.isdigit():
        raise AlterError(ErrorCode.INVALID_REQUEST, f"broker resource name {name!r} is not a node id")
    if not broker.cluster.enabled and int(name) != broker.node_id:
        raise AlterError(ErrorCode.INVALID_REQUEST, f"broker {name} is not this broker ({broker.node_id})")
    return name


# -- single broker: storage of dynamic broker configs -----------------------------------------

def load_dynamic_broker_configs(broker) -> None:
    """Single broker: read ``dynamic_broker_configs.json`` (before the topics open, so their
    logs start with the right limits). A damaged file is reported and ignored."""
    if broker.config.metadata_store:
        return   # a cluster member takes them from etcd
    path = Path(broker.config.data_dir) / DYNAMIC_FILE
    try:
        data = json.loads(path.read_text())
        stored = {str(k): {str(n): str(v) for n, v in d.items()} for k, d in data.items()}
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError, TypeError) as e:
        log.error("%s is damaged (%s); starting with no dynamic broker configs", path, e)
        return
    broker.dynamic_broker_configs = stored
    broker.topics.set_dynamic_broker_configs(stored.get(DEFAULT_BROKER_CONFIGS, {}),
                                             stored.get(str(broker.node_id), {}))


def current_broker_configs(broker, key: str) -> dict[str, str]:
    if broker.cluster.enabled:
        return dict(broker.cluster.image.broker_configs.get(key, {}))
    return dict(getattr(broker, "dynamic_broker_configs", {}).get(key, {}))


# -- the request ----------------------------------------------------------------------------

async def alter(ctx, request: dict, version: int, api_key: int, incremental: bool) -> dict:
    broker = ctx.broker
    cluster = broker.cluster
    if cluster.enabled and not cluster.is_controller:
        # Kafka forwards config changes to its controller; so does canopy.
        return await cluster.forward_to_controller(api_key, version, request, lambda msg: {
            "throttle_time_ms": 0, "responses": [
                {"error_code": ErrorCode.NOT_CONTROLLER, "error_message": msg,
                 "resource_type": r["resource_type"], "resource_name": r["resource_name"]}
                for r in request["resources"]]})
    validate_only = request.get("validate_only", False)
    seen = set()
    out = []
    for res in request["resources"]:
        rtype, rname = res["resource_type"], res["resource_name"]
        r = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": rname}
        try:
            if (rtype, rname) in seen:
                raise AlterError(ErrorCode.INVALID_REQUEST, f"resource {rname!r} named twice in one request")
            seen.add((rtype, rname))
            names = [c["name"] for c in res.get("configs") or []]
            if len(names) != len(set(names)):
                raise AlterError(ErrorCode.INVALID_REQUEST, "a config is named twice for one resource")
            if rtype == TOPIC:
                await _alter_topic(broker, rname, res.get("configs") or [], incremental, validate_only)
            elif rtype == BROKER:
                await _alter_broker(broker, rname, res.get("configs") or [], incremental, validate_only)
            else:
                raise AlterError(ErrorCode.INVALID_REQUEST, f"resource type {rtype} is not supported")
        except AlterError as e:
            r.update(error_code=e.code, error_message=str(e))
        except TopicError as e:
            r.update(error_code=e.code, error_message=str(e))
        out.append(r)
    return {"throttle_time_ms": 0, "responses": out}


async def _alter_topic(broker, name: str, changes: list, incremental: bool, validate_only: bool) -> None:
    registry = broker.topics
    cluster = broker.cluster
    if cluster.enabled:
        t = cluster.image.topics.get(name)
        current = dict(t.configs) if t is not None else None
    else:
        topic = registry.get(name)
        current = dict(topic.configs) if topic is not None else None
    if current is None:
        raise AlterError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
    new = new_topic_configs(current, changes, incremental, lambda n: registry.resolve({}, n).value)
    if validate_only or new == current:
        return
    if cluster.enabled:
        await cluster.controller_call(cluster.controller.alter_topic_configs, name, new)
    else:
        registry.set_configs(registry.get(name), new)


async def _alter_broker(broker, name: str, changes: list, incremental: bool, validate_only: bool) -> None:
    key = broker_resource_key(broker, name)
    current = current_broker_configs(broker, key)
    new = new_broker_configs(name, current, changes, incremental)
    if validate_only or new == current:
        return
    cluster = broker.cluster
    if cluster.enabled:
        await cluster.controller_call(cluster.controller.set_broker_configs, key, new)
        return
    stored = dict(getattr(broker, "dynamic_broker_configs", {}))
    if new:
        stored[key] = new
    else:
        stored.pop(key, None)
    replace_durably(Path(broker.config.data_dir) / DYNAMIC_FILE, json.dumps(stored, indent=1, sort_keys=True))
    broker.dynamic_broker_configs = stored
    broker.topics.set_dynamic_broker_configs(stored.get(DEFAULT_BROKER_CONFIGS, {}),
                                             stored.get(str(broker.node_id), {}))
