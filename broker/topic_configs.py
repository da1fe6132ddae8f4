"""Every Kafka topic config, in one table: what CreateTopics, DescribeConfigs, AlterConfigs
and IncrementalAlterConfigs accept, validate and show.

Each entry is Kafka's (Kafka 3.9's TopicConfig / LogConfig): name, type, default, valid
values or range, and the broker config it inherits from (its "synonym": a topic without an
override takes the broker's value, which may itself be a dynamic broker config). ``acted``
says whether canopy does something with it today; the others are accepted, stored and
shown so that tools which set them (Kafka Streams, Debezium, Terraform providers) work,
and README.md lists them as not acted on. Validation errors carry Kafka's wording
(``Invalid value X for configuration Y: ...``) and the INVALID_CONFIG code.

"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from protocol.errors import ErrorCode

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1

# DescribeConfigs v3+ ConfigType enum.
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST = 1, 2, 3, 4, 5, 6, 7
_TYPE_NAMES = {BOOLEAN: "BOOLEAN", STRING: "STRING", INT: "INT", LONG: "LONG", DOUBLE: "DOUBLE", LIST: "LIST"}

# DescribeConfigs config_source enum.
SOURCE_TOPIC = 1                  # TOPIC_CONFIG (Kafka's DYNAMIC_TOPIC_CONFIG in the admin client)
SOURCE_DYNAMIC_BROKER = 2         # DYNAMIC_BROKER_CONFIG: set for this broker with AlterConfigs
SOURCE_DYNAMIC_DEFAULT_BROKER = 3 # DYNAMIC_DEFAULT_BROKER_CONFIG: set for every broker
SOURCE_STATIC_BROKER = 4          # STATIC_BROKER_CONFIG: canopy's flags / env / TOML
SOURCE_DEFAULT = 5                # DEFAULT_CONFIG: Kafka's default


class ConfigError(Exception):
    """A config Kafka would refuse; ``code`` is the Kafka error to answer."""

    def __init__(self, message: str, code: int = ErrorCode.INVALID_CONFIG):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TopicConfig:
    name: str
    type: int
    default: str                  # Kafka's default, as DescribeConfigs shows it
    broker_name: str | None       # the broker config a topic inherits it from
    acted: bool                   # canopy does something with it today
    check: Callable[[object], str | None] | None = None   # parsed value -> Kafka's reason, or None
    choices: tuple[str, ...] | None = None
    alterable: bool = True        # AlterConfigs may change it after creation
    doc: str = ""

    def parse(self, value: str | None):
        """The typed value; ConfigError with Kafka's message when it is not valid."""
        if value is None:
            raise ConfigError(f"Invalid value null for configuration {self.name}: value must not be null")
        v = value.strip()
        try:
            if self.type == BOOLEAN:
                if v.lower() not in ("true", "false"):
                    raise ValueError("Expected value to be either true or false")
                parsed = v.lower() == "true"
            elif self.type in (INT, LONG):
                try:
                    parsed = int(v)
                except ValueError:
                    raise ValueError(f"Not a number of type {_TYPE_NAMES[self.type]}") from None
                lo, hi = (-(1 << 31), INT_MAX) if self.type == INT else (-(1 << 63), LONG_MAX)
                if not lo <= parsed <= hi:
                    raise ValueError(f"Not a number of type {_TYPE_NAMES[self.type]}")
            elif self.type == DOUBLE:
                try:
                    parsed = float(v)
                except ValueError:
                    raise ValueError("Not a number of type DOUBLE") from None
            elif self.type == LIST:
                parsed = [x.strip() for x in v.split(",")] if v else []
                if self.choices is not None:
                    bad = [x for x in parsed if x not in self.choices]
                    if bad or not parsed:
                        raise ValueError(f"String must be one of: {', '.join(self.choices)}")
            else:
                parsed = v
                if self.choices is not None and v not in self.choices:
                    raise ValueError(f"String must be one of: {', '.join(self.choices)}")
            if self.check is not None and (reason := self.check(parsed)):
                raise ValueError(reason)
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {self.name}: {e}") from None
        return parsed


def _at_least(n):
    return lambda v: None if v >= n else f"Value must be at least {n}"


def _between(lo, hi):
    return lambda v: None if lo <= v <= hi else f"Value must be no less than {lo} and no more than {hi}"


def _level(lo, hi, default):
    return lambda v: None if v == default or lo <= v <= hi else \
        f"Value must be between {lo} and {hi}, or {default} for the codec's default"


_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

_TABLE = [
    TopicConfig("cleanup.policy", LIST, "delete", "log.cleanup.policy", True,
                choices=("compact", "delete"),
                doc="delete: retention by time and size; compact: the log cleaner keeps the latest "
                    "record per key (docs/compaction.md)"),
    TopicConfig("compression.type", STRING, "producer", "compression.type", True, choices=_COMPRESSION,
                doc="producer keeps the client's codec; any other value recompresses on produce"),
    TopicConfig("compression.gzip.level", INT, "-1", "compression.gzip.level", False, _level(1, 9, -1)),
    TopicConfig("compression.lz4.level", INT, "9", "compression.lz4.level", False, _between(1, 17)),
    TopicConfig("compression.zstd.level", INT, "3", "compression.zstd.level", False, _between(-131072, 22)),
    TopicConfig("delete.retention.ms", LONG, "86400000", "log.cleaner.delete.retention.ms", True, _at_least(0),
                doc="how long tombstones of a compacted topic are kept"),
    TopicConfig("file.delete.delay.ms", LONG, "60000", "log.segment.delete.delay.ms", False, _at_least(0)),
    TopicConfig("flush.messages", LONG, str(LONG_MAX), "log.flush.interval.messages", False, _at_least(1),
                doc="canopy flushes by its broker-wide flush policy"),
    TopicConfig("flush.ms", LONG, str(LONG_MAX), "log.flush.interval.ms", False, _at_least(0),
                doc="canopy flushes by its broker-wide flush policy"),
    TopicConfig("follower.replication.throttled.replicas", LIST, "", "follower.replication.throttled.replicas",
                False),
    TopicConfig("index.interval.bytes", INT, "4096", "log.index.interval.bytes", False, _at_least(0),
                doc="canopy indexes every batch"),
    TopicConfig("leader.replication.throttled.replicas", LIST, "", "leader.replication.throttled.replicas", False),
    TopicConfig("local.retention.bytes", LONG, "-2", "log.local.retention.bytes", False, _at_least(-2)),
    TopicConfig("local.retention.ms", LONG, "-2", "log.local.retention.ms", False, _at_least(-2)),
    TopicConfig("max.compaction.lag.ms", LONG, str(LONG_MAX), "log.cleaner.max.compaction.lag.ms", True,
                _at_least(1)),
    TopicConfig("max.message.bytes", INT, "1048588", "message.max.bytes", True, _at_least(0)),
    TopicConfig("message.downconversion.enable", BOOLEAN, "true", "log.message.downconversion.enable", False,
                doc="canopy serves record batches v2 only"),
    TopicConfig("message.format.version", STRING, "3.0-IV1", "log.message.format.version", False,
                doc="deprecated in Kafka 3; canopy writes v2 batches whatever it says"),
    TopicConfig("message.timestamp.after.max.ms", LONG, str(LONG_MAX), "log.message.timestamp.after.max.ms", True,
                _at_least(0)),
    TopicConfig("message.timestamp.before.max.ms", LONG, str(LONG_MAX), "log.message.timestamp.before.max.ms",
                True, _at_least(0)),
    TopicConfig("message.timestamp.difference.max.ms", LONG, str(LONG_MAX),
                "log.message.timestamp.difference.max.ms", True, _at_least(0)),
    TopicConfig("message.timestamp.type", STRING, "CreateTime", "log.message.timestamp.type", True,
                choices=("CreateTime", "LogAppendTime")),
    TopicConfig("min.cleanable.dirty.ratio", DOUBLE, "0.5", "log.cleaner.min.cleanable.ratio", True,
                _between(0, 1)),
    TopicConfig("min.compaction.lag.ms", LONG, "0", "log.cleaner.min.compaction.lag.ms", True, _at_least(0)),
    TopicConfig("min.insync.replicas", INT, "1", "min.insync.replicas", True, _at_least(1)),
    TopicConfig("preallocate", BOOLEAN, "false", "log.preallocate", False,
                doc="canopy always extends its active segment sparsely and reserves disk blocks ahead of the writes"),
    TopicConfig("remote.log.copy.disable", BOOLEAN, "false", None, False),
    TopicConfig("remote.log.delete.on.disable", BOOLEAN, "false", None, False),
    TopicConfig("remote.storage.enable", BOOLEAN, "false", None, False, doc="canopy has no tiered storage"),
    TopicConfig("retention.bytes", LONG, "-1", "log.retention.bytes", True),
    TopicConfig("retention.ms", LONG, "604800000", "log.retention.ms", True, _at_least(-1)),
    TopicConfig("segment.bytes", INT, "1073741824", "log.segment.bytes", True, _at_least(14)),
    TopicConfig("segment.index.bytes", INT, "10485760", "log.index.size.max.bytes", False, _at_least(4),
                doc="canopy's index grows with its segment"),
    TopicConfig("segment.jitter.ms", LONG, "0", "log.roll.jitter.ms", False, _at_least(0)),
    TopicConfig("segment.ms", LONG, "604800000", "log.roll.ms", True, _at_least(1)),
    TopicConfig("unclean.leader.election.enable", BOOLEAN, "false", "unclean.leader.election.enable", True),
    # canopy's own: children per replica in this topic's replication trees. The trees are
    # laid out when the topic is created, so it cannot change afterwards.
    TopicConfig("replication.fanout", INT, "2", "canopy.fanout", True, _at_least(1), alterable=False,
                doc="canopy: children per replica in this topic's replication trees"),
]

TOPIC_CONFIGS: dict[str, TopicConfig] = {c.name: c for c in _TABLE}

# Broker configs that AlterConfigs may change on a running broker (resource type BROKER),
# as in Kafka: the defaults of topic configs canopy acts on. Every broker applies them at
# once to every topic without its own override.
DYNAMIC_BROKER_CONFIGS: dict[str, TopicConfig] = {
    c.broker_name: c for c in _TABLE if c.broker_name in (
        "log.retention.ms", "log.retention.bytes", "log.segment.bytes", "log.roll.ms", "message.max.bytes",
        "log.message.timestamp.type", "log.cleanup.policy", "min.insync.replicas",
        "unclean.leader.election.enable", "compression.type")}


def validate(configs: dict[str, str | None], *, creating: bool = True) -> dict[str, object]:
    """Check topic configs (CreateTopics, or a topic's full set after an alter); returns
    the parsed values. ConfigError (INVALID_CONFIG) names the first problem."""
    out = {}
    for name, value in configs.items():
        c = TOPIC_CONFIGS.get(name)
        if c is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        out[name] = c.parse(value)
    return out


def static_broker_values(config) -> dict[str, str]:
    """The broker configs canopy's own settings give (flags, environment, TOML), by Kafka
    broker config name: the STATIC_BROKER_CONFIG layer of topic defaults."""
    return {
        "log.retention.ms": str(config.log_retention_ms),
        "log.retention.bytes": str(config.log_retention_bytes),
        "log.segment.bytes": str(config.log_segment_bytes),
        "log.roll.ms": str(config.log_segment_ms),
        "message.max.bytes": str(config.message_max_bytes),
        "min.insync.replicas": str(config.min_insync_replicas),
        "unclean.leader.election.enable": str(config.unclean_leader_election_enable).lower(),
        "canopy.fanout": str(config.fanout),
    }


@dataclass
class Resolved:
    value: str
    source: int
    synonyms: list[tuple[str, str, int]]   # (name, value, source), most specific first


def resolve(c: TopicConfig, topic_configs: dict[str, str], dynamic_broker: dict[str, str],
            dynamic_default: dict[str, str], static: dict[str, str]) -> Resolved:
    """A topic config's effective value and where it comes from, as Kafka resolves it:
    topic override, then this broker's dynamic config, the cluster-wide dynamic default,
    the broker's static config, Kafka's default."""
    syn = []
    if c.name in topic_configs:
        syn.append((c.name, topic_configs[c.name], SOURCE_TOPIC))
    b = c.broker_name
    if b is not None:
        if b in dynamic_broker:
            syn.append((b, dynamic_broker[b], SOURCE_DYNAMIC_BROKER))
        if b in dynamic_default:
            syn.append((b, dynamic_default[b], SOURCE_DYNAMIC_DEFAULT_BROKER))
        if b in static and static[b] != c.default:
            syn.append((b, static[b], SOURCE_STATIC_BROKER))
    syn.append((b or c.name, c.default, SOURCE_DEFAULT))
    return Resolved(syn[0][1], syn[0][2], syn)
