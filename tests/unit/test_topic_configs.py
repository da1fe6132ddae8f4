"""broker/topic_configs.py and broker/config_admin.py: validation with Kafka's messages,
resolution of a topic config through the broker's layers, and the alter rules."""
import pytest

from broker import config_admin as ca
from broker import topic_configs as tc
from protocol.errors import ErrorCode


@pytest.mark.parametrize("configs,message", [
    ({"nope": "1"}, "Unknown topic config name: nope"),
    ({"retention.ms": "-2"}, "Invalid value -2 for configuration retention.ms: Value must be at least -1"),
    ({"segment.bytes": "3000000000"}, "Invalid value 3000000000 for configuration segment.bytes: "
                                      "Not a number of type INT"),
    ({"segment.ms": "x"}, "Not a number of type LONG"),
    ({"min.cleanable.dirty.ratio": "2"}, "Value must be no less than 0 and no more than 1"),
    ({"min.cleanable.dirty.ratio": "half"}, "Not a number of type DOUBLE"),
    ({"unclean.leader.election.enable": "yes"}, "Expected value to be either true or false"),
    ({"compression.type": "brotli"}, "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
    ({"cleanup.policy": "delete,shred"}, "String must be one of: compact, delete"),
    ({"compression.gzip.level": "12"}, "compression.gzip.level"),
    ({"retention.ms": None}, "must not be null"),
])
def test_invalid_configs_get_kafkas_message(configs, message):
    with pytest.raises(tc.ConfigError) as ei:
        tc.validate(configs)
    assert message in str(ei.value)
    assert ei.value.code == ErrorCode.INVALID_CONFIG


def test_valid_configs_parse():
    parsed = tc.validate({"retention.ms": "-1", "cleanup.policy": "delete", "preallocate": "TRUE",
                          "min.cleanable.dirty.ratio": "0.25", "compression.gzip.level": "-1",
                          "leader.replication.throttled.replicas": ""})
    assert parsed == {"retention.ms": -1, "cleanup.policy": ["delete"], "preallocate": True,
                      "min.cleanable.dirty.ratio": 0.25, "compression.gzip.level": -1,
                      "leader.replication.throttled.replicas": []}


def test_cleanup_policies_of_kafka_are_accepted_and_others_refused():
    assert tc.validate({"cleanup.policy": "compact,delete"}) == {"cleanup.policy": ["compact", "delete"]}
    assert tc.validate({"cleanup.policy": "compact"}) == {"cleanup.policy": ["compact"]}
    with pytest.raises(tc.ConfigError):
        tc.validate({"cleanup.policy": "shred"})


def test_resolution_order_and_synonyms():
    c = tc.TOPIC_CONFIGS["retention.ms"]
    static = {"log.retention.ms": "604800000"}   # equal to Kafka's default: not "static"
    r = tc.resolve(c, {}, {}, {}, static)
    assert (r.value, r.source) == ("604800000", tc.SOURCE_DEFAULT)
    r = tc.resolve(c, {}, {}, {}, {"log.retention.ms": "1000"})
    assert (r.value, r.source) == ("1000", tc.SOURCE_STATIC_BROKER)
    r = tc.resolve(c, {}, {"log.retention.ms": "3"}, {"log.retention.ms": "2"}, {"log.retention.ms": "1000"})
    assert (r.value, r.source) == ("3", tc.SOURCE_DYNAMIC_BROKER)
    assert [s[2] for s in r.synonyms] == [tc.SOURCE_DYNAMIC_BROKER, tc.SOURCE_DYNAMIC_DEFAULT_BROKER,
                                          tc.SOURCE_STATIC_BROKER, tc.SOURCE_DEFAULT]
    r = tc.resolve(c, {"retention.ms": "9"}, {}, {"log.retention.ms": "2"}, static)
    assert (r.value, r.source) == ("9", tc.SOURCE_TOPIC)
    assert r.synonyms == [("retention.ms", "9", tc.SOURCE_TOPIC),
                          ("log.retention.ms", "2", tc.SOURCE_DYNAMIC_DEFAULT_BROKER),
                          ("log.retention.ms", "604800000", tc.SOURCE_DEFAULT)]


def test_incremental_operations():
    cur = {"retention.ms": "5", "segment.ms": "100"}
    new = ca.new_topic_configs(cur, [{"name": "retention.ms", "config_operation": ca.DELETE, "value": None},
                                     {"name": "max.message.bytes", "config_operation": ca.SET, "value": "10"}],
                               incremental=True)
    assert new == {"segment.ms": "100", "max.message.bytes": "10"}
    new = ca.new_topic_configs({}, [{"name": "leader.replication.throttled.replicas", "config_operation": ca.APPEND,
                                     "value": "0:1,0:2"}], incremental=True)
    assert new == {"leader.replication.throttled.replicas": "0:1,0:2"}
    new = ca.new_topic_configs(new, [{"name": "leader.replication.throttled.replicas",
                                      "config_operation": ca.SUBTRACT, "value": "0:1"}], incremental=True)
    assert new == {"leader.replication.throttled.replicas": "0:2"}
    with pytest.raises(ca.AlterError) as ei:
        ca.new_topic_configs(cur, [{"name": "retention.ms", "config_operation": ca.APPEND, "value": "1"}], True)
    assert ei.value.code == ErrorCode.INVALID_CONFIG
    assert "Config value append is not allowed for config key: retention.ms" in str(ei.value)


def test_alter_configs_replaces_the_set_and_fanout_is_fixed():
    cur = {"retention.ms": "5", "replication.fanout": "3"}
    assert ca.new_topic_configs(cur, [{"name": "segment.ms", "value": "7"},
                                      {"name": "replication.fanout", "value": "3"}], incremental=False) == \
        {"segment.ms": "7", "replication.fanout": "3"}
    with pytest.raises(ca.AlterError) as ei:
        ca.new_topic_configs(cur, [{"name": "segment.ms", "value": "7"}], incremental=False)
    assert "replication.fanout is fixed" in str(ei.value)


def test_broker_configs_dynamic_static_unknown():
    assert ca.new_broker_configs("0", {}, [{"name": "log.retention.ms", "config_operation": ca.SET,
                                            "value": "100"}], True) == {"log.retention.ms": "100"}
    with pytest.raises(ca.AlterError) as ei:
        ca.new_broker_configs("0", {}, [{"name": "num.partitions", "value": "3"}], False)
    assert ei.value.code == ErrorCode.INVALID_REQUEST
    assert "Cannot update these configs dynamically: Set(num.partitions)" in str(ei.value)
    with pytest.raises(ca.AlterError) as ei:
        ca.new_broker_configs("0", {}, [{"name": "min.insync.replicas", "value": "0"}], False)
    assert ei.value.code == ErrorCode.INVALID_CONFIG
    assert "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1" in str(ei.value)
    with pytest.raises(ca.AlterError) as ei:
        ca.new_broker_configs("0", {}, [{"name": "made.up", "value": "0"}], False)
    assert ei.value.code == ErrorCode.INVALID_CONFIG
