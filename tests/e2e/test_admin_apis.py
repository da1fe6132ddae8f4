"""Issue 12's admin APIs against a real `canopy serve`, from confluent-kafka's AdminClient:
IncrementalAlterConfigs / AlterConfigs (topic and broker, validate_only, Kafka's answers
for an unknown config, an out-of-range value and a static broker config),
DescribeConfigs' sources and synonyms, CreateTopics with every Kafka topic config,
DeleteGroups (unknown group, non-empty group), ElectLeaders, and compression.type
recompressing on produce; from kafka-python 3's KafkaAdminClient (which can also send
OffsetDelete, DescribeLogDirs and DescribeProducers); and byte-level with a raw client.
The Java AdminClient runs the same calls in tests/e2e/test_java_admin.py.
"""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic,
                                   ResourceType)

from .test_confluent import admin_for, create_topic, drain, unique_topic

pytestmark = pytest.mark.timeout(240)


def _describe(admin, topic):
    # librdkafka always asks for synonyms.
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res], request_timeout=10)[res].result(timeout=15)


def _incremental(admin, resource, entries, validate_only=False):
    resource = ConfigResource(resource.restype, resource.name, incremental_configs=entries)
    return admin.incremental_alter_configs([resource], request_timeout=10,
                                           validate_only=validate_only)[resource]


def _error(future) -> KafkaError:
    with pytest.raises(KafkaException) as ei:
        future.result(timeout=15)
    return ei.value.args[0]


def test_create_topic_accepts_every_kafka_topic_config(broker, request):
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1, config={
        "delete.retention.ms": "3600000", "min.cleanable.dirty.ratio": "0.3", "segment.jitter.ms": "10",
        "preallocate": "true", "flush.messages": "1000", "message.downconversion.enable": "false",
        "retention.ms": "7200000", "compression.type": "lz4"})
    configs = _describe(admin, topic)
    assert configs["delete.retention.ms"].value == "3600000"
    assert configs["delete.retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not configs["delete.retention.ms"].is_default
    assert configs["min.cleanable.dirty.ratio"].value == "0.3"
    # Not set: Kafka's default, flagged as such.
    assert configs["max.compaction.lag.ms"].value == str((1 << 63) - 1)
    assert configs["max.compaction.lag.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.compaction.lag.ms"].is_default
    assert configs["segment.index.bytes"].value == "10485760"

    bad = [({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
           ({"retention.ms": "-5"}, "Invalid value -5 for configuration retention.ms: Value must be at least -1"),
           ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
           ({"preallocate": "maybe"}, "Expected value to be either true or false"),
           ({"segment.bytes": "lots"}, "Not a number of type INT"),
           ({"message.timestamp.type": "Whenever"}, "String must be one of: CreateTime, LogAppendTime")]
    for config, message in bad:
        name = unique_topic(request, "bad")
        fut = admin.create_topics([NewTopic(name, 1, 1, config=config)], request_timeout=15)[name]
        err = _error(fut)
        assert err.code() == KafkaError.INVALID_CONFIG, (config, err)
        assert message in err.str(), (config, err)
    assert not [t for t in admin.list_topics(timeout=10).topics if t.startswith("bad-")]


def test_incremental_alter_configs_takes_effect_at_once(broker, request):
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1)
    res = ConfigResource(ResourceType.TOPIC, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000,
                         "message.max.bytes": 2_000_000})

    def produce(size: int):
        errors = []
        producer.produce(topic, value=b"x" * size, on_delivery=lambda err, msg: errors.append(err))
        drain(producer)
        return errors[0]

    assert produce(50_000) is None
    # validate_only changes nothing.
    _incremental(admin, res, [ConfigEntry("max.message.bytes", "10000", incremental_operation=AlterConfigOpType.SET)],
                 validate_only=True).result(timeout=15)
    assert _describe(admin, topic)["max.message.bytes"].is_default
    assert produce(50_000) is None

    _incremental(admin, res, [ConfigEntry("max.message.bytes", "10000", incremental_operation=AlterConfigOpType.SET),
                              ConfigEntry("delete.retention.ms", "1000",
                                          incremental_operation=AlterConfigOpType.SET)]).result(timeout=15)
    configs = _describe(admin, topic)
    assert configs["max.message.bytes"].value == "10000"
    assert configs["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    err = produce(50_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    # DELETE returns it to the inherited value: the large record goes through again.
    _incremental(admin, res, [ConfigEntry("max.message.bytes", None,
                                          incremental_operation=AlterConfigOpType.DELETE)]).result(timeout=15)
    configs = _describe(admin, topic)
    assert configs["max.message.bytes"].is_default and configs["max.message.bytes"].value == "1048588"
    assert configs["delete.retention.ms"].value == "1000"
    assert produce(50_000) is None

    # APPEND / SUBTRACT are for list configs only, as in Kafka.
    err = _error(_incremental(admin, res, [ConfigEntry("retention.ms", "5",
                                                       incremental_operation=AlterConfigOpType.APPEND)]))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    _incremental(admin, res, [ConfigEntry("leader.replication.throttled.replicas", "0:0",
                                          incremental_operation=AlterConfigOpType.APPEND)]).result(timeout=15)
    assert _describe(admin, topic)["leader.replication.throttled.replicas"].value == "0:0"

    # Kafka's answers for bad input.
    err = _error(_incremental(admin, res, [ConfigEntry("no.such.config", "1",
                                                       incremental_operation=AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.INVALID_CONFIG and "Unknown topic config name: no.such.config" in err.str()
    err = _error(_incremental(admin, res, [ConfigEntry("min.insync.replicas", "0",
                                                       incremental_operation=AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.INVALID_CONFIG
    assert "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1" in err.str()
    missing = ConfigResource(ResourceType.TOPIC, unique_topic(request, "missing"))
    err = _error(_incremental(admin, missing, [ConfigEntry("retention.ms", "1",
                                                           incremental_operation=AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, err


def test_alter_configs_replaces_the_whole_set_and_survives_restart(broker, request):
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1, config={"retention.ms": "7200000", "segment.ms": "3600000"})
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.bytes": "1048576"})
    admin.alter_configs([res], request_timeout=10)[res].result(timeout=15)
    configs = _describe(admin, topic)
    assert configs["retention.bytes"].value == "1048576"
    assert configs["retention.ms"].is_default and configs["segment.ms"].is_default
    broker.stop()
    broker.start()
    admin = admin_for(broker)
    assert _describe(admin, topic)["retention.bytes"].value == "1048576"


def test_broker_dynamic_configs(broker, request):
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1)
    this_broker = ConfigResource(ResourceType.BROKER, "0")
    # A dynamic broker default reaches every topic without an override, with its source.
    _incremental(admin, this_broker, [ConfigEntry("log.retention.ms", "3600000",
                                                  incremental_operation=AlterConfigOpType.SET)]).result(timeout=15)
    configs = _describe(admin, topic)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    # (confluent-kafka keys synonyms by name, so the dynamic and default entries of
    # log.retention.ms collapse into one here; the Java test reads the whole chain.)
    assert "log.retention.ms" in configs["retention.ms"].synonyms
    bres = ConfigResource(ResourceType.BROKER, "0")
    bconfigs = admin.describe_configs([bres], request_timeout=10)[bres].result(timeout=15)
    assert bconfigs["log.retention.ms"].value == "3600000"
    assert bconfigs["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert bconfigs["num.partitions"].is_read_only

    # Static broker configs are refused as Kafka refuses them.
    err = _error(_incremental(admin, this_broker, [ConfigEntry("num.partitions", "3",
                                                               incremental_operation=AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.INVALID_REQUEST, err
    assert "Cannot update these configs dynamically" in err.str()
    err = _error(_incremental(admin, this_broker, [ConfigEntry("min.insync.replicas", "zero",
                                                               incremental_operation=AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.INVALID_CONFIG, err

    # It persists across a restart, and DELETE takes it away.
    broker.stop()
    broker.start()
    admin = admin_for(broker)
    assert _describe(admin, topic)["retention.ms"].value == "3600000"
    _incremental(admin, this_broker, [ConfigEntry("log.retention.ms", None,
                                                  incremental_operation=AlterConfigOpType.DELETE)]).result(timeout=15)
    assert _describe(admin, topic)["retention.ms"].is_default


def test_delete_consumer_groups(broker, request):
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce(topic, value=b"%d" % i)
    drain(p)
    group = unique_topic(request, "group")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < 10 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got += 1
    assert got == 10
    c.commit(asynchronous=False)

    err = _error(admin.delete_consumer_groups([group], request_timeout=15)[group])
    assert err.code() == KafkaError.NON_EMPTY_GROUP, err
    c.close()
    admin.delete_consumer_groups([group], request_timeout=15)[group].result(timeout=20)
    # The committed offsets went with it.
    from confluent_kafka import ConsumerGroupTopicPartitions
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])])[group].result(timeout=15)
    assert offsets.topic_partitions[0].offset < 0
    unknown = unique_topic(request, "nogroup")
    err = _error(admin.delete_consumer_groups([unknown], request_timeout=15)[unknown])
    assert err.code() == KafkaError.GROUP_ID_NOT_FOUND, err


def test_elect_leaders_on_one_broker(broker, request):
    from confluent_kafka import ElectionType
    admin = admin_for(broker)
    topic = unique_topic(request)
    create_topic(admin, topic, 1)
    # (confluent-kafka 2.16 raises SystemError when elect_leaders gets request_timeout)
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(timeout=20)
    tp = result[TopicPartition(topic, 0)]
    assert tp is not None and tp.code() == KafkaError.ELECTION_NOT_NEEDED, result


# -- compression.type recompresses on produce; the other admin APIs, byte level -------------

def _fetch_batches(client, topic):
    from protocol.messages import ApiKey
    from protocol.records import BatchHeader
    r = client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 24, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 24, "current_leader_epoch": -1,
             "log_start_offset": -1}]}]})
    records = bytes(r["responses"][0]["partitions"][0]["records"] or b"")
    out, pos = [], 0
    while pos < len(records):
        h = BatchHeader.parse(records, pos)
        out.append((h, records[pos:pos + h.total_size]))
        pos += h.total_size
    return out


def test_compression_type_recompresses_on_produce(broker, request):
    from protocol.records import CODEC_GZIP, CODEC_NONE, CODEC_ZSTD, build_batch, iter_records
    from .rawclient import RawClient, create_topic as raw_create, produce as raw_produce
    client = RawClient(broker.bootstrap)
    try:
        values = [b"value-%d" % i * 20 for i in range(50)]
        plain = build_batch([(b"k%d" % i, v, [], None) for i, v in enumerate(values)])
        gz = build_batch([(b"k%d" % i, v, [], None) for i, v in enumerate(values)], codec=CODEC_GZIP)
        expect = {"zstd": CODEC_ZSTD, "uncompressed": CODEC_NONE, "producer": None}
        for ctype, codec in expect.items():
            topic = unique_topic(request, f"ct-{ctype}")
            raw_create(client, topic, {"compression.type": ctype})
            for batch in (plain, gz):
                assert raw_produce(client, topic, batch)["error_code"] == 0
            got = _fetch_batches(client, topic)
            assert len(got) == 2
            for (h, raw), sent in zip(got, (plain, gz)):
                want = codec if codec is not None else sent[22] & 7
                assert h.compression == want, (ctype, h)
                assert [r.value for r in iter_records(raw)] == values
                assert [r.key for r in iter_records(raw)] == [b"k%d" % i for i in range(50)]
        # A change takes effect on the next produce, no restart.
        topic = unique_topic(request, "ct-alter")
        raw_create(client, topic)
        assert raw_produce(client, topic, plain)["error_code"] == 0
        admin = admin_for(broker)
        _incremental(admin, ConfigResource(ResourceType.TOPIC, topic),
                     [ConfigEntry("compression.type", "gzip", incremental_operation=AlterConfigOpType.SET)]
                     ).result(timeout=15)
        assert raw_produce(client, topic, plain)["error_code"] == 0
        assert [h.compression for h, _ in _fetch_batches(client, topic)] == [CODEC_NONE, CODEC_GZIP]
    finally:
        client.close()

    # A real client reads what was recompressed (librdkafka lz4 -> snappy topic).
    admin = admin_for(broker)
    topic = unique_topic(request, "ct-ck")
    create_topic(admin, topic, 1, config={"compression.type": "snappy"})
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4", "linger.ms": 20})
    for i in range(2000):
        p.produce(topic, key=b"%d" % i, value=b"payload-%d" % i)
    drain(p)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_topic(request, "g"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 2000 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [b"payload-%d" % i for i in range(2000)]


def test_offset_delete_log_dirs_and_producers_raw(broker, request):
    from protocol.errors import ErrorCode
    from protocol.messages import ApiKey
    from .rawclient import RawClient, create_topic as raw_create, init_producer_id, make_batch, produce as raw_produce
    client = RawClient(broker.bootstrap)
    try:
        topic = unique_topic(request, "raw")
        raw_create(client, topic)
        pid, epoch = init_producer_id(client)
        batch = make_batch([b"a", b"b", b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert raw_produce(client, topic, batch)["error_code"] == 0

        r = client.request(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": topic, "partition_indexes": [0, 5]}]})
        p0, p5 = r["topics"][0]["partitions"]
        assert p0["error_code"] == 0
        assert [(a["producer_id"], a["producer_epoch"], a["last_sequence"]) for a in p0["active_producers"]] == \
            [(pid, epoch, 2)]
        assert p5["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        r = client.request(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": topic, "partitions": [0]}]})
        (d,) = r["results"]
        assert d["error_code"] == 0 and d["log_dir"].endswith("topics") and d["total_bytes"] > 0
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in d["topics"]] == [(topic, [0])]
        assert d["topics"][0]["partitions"][0]["partition_size"] >= len(batch)

        group = unique_topic(request, "og")
        commit = client.request(ApiKey.OFFSET_COMMIT, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 2,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
        assert commit["topics"][0]["partitions"][0]["error_code"] == 0
        delete = {"group_id": group, "topics": [{"name": topic, "partitions": [{"partition_index": 0},
                                                                                 {"partition_index": 9}]}]}
        r = client.request(ApiKey.OFFSET_DELETE, 0, delete)
        assert r["error_code"] == 0
        assert [p["error_code"] for p in r["topics"][0]["partitions"]] == [0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
        fetched = client.request(ApiKey.OFFSET_FETCH, 7, {"group_id": group, "topics": [
            {"name": topic, "partition_indexes": [0]}], "require_stable": False})
        assert fetched["topics"][0]["partitions"][0]["committed_offset"] == -1
        r = client.request(ApiKey.OFFSET_DELETE, 0, {**delete, "group_id": unique_topic(request, "nogroup")})
        assert r["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND
    finally:
        client.close()


def test_kafka_python_admin_calls(broker, request):
    """The same calls from kafka-python 3's KafkaAdminClient (it can send all of them)."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        topic, group = unique_topic(request, "kp"), unique_topic(request, "kpg")
        admin.create_topics([KNewTopic(topic, 1, 1, topic_configs={"delete.retention.ms": "1000"})])
        res = lambda configs: KConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)  # noqa: E731
        for incremental in (False, True):   # AlterConfigs (33), IncrementalAlterConfigs (44)
            r = admin.alter_configs([res({"retention.ms": "3600000", "delete.retention.ms": "1000"})],
                                    incremental=incremental)
            assert r == {"topic": {topic: "OK"}}, r
            r = admin.alter_configs([res({"nope": "1"})], raise_on_unknown=False, incremental=incremental)
            assert "[Error 40] InvalidConfigurationError: Unknown topic config name: nope" in r["topic"][topic], r
            r = admin.alter_configs([res({"retention.ms": "-9"})], incremental=incremental)
            assert "Invalid value -9 for configuration retention.ms: Value must be at least -1" in r["topic"][topic]
        d = admin.describe_configs([KConfigResource(ConfigResourceType.TOPIC, topic)])["topic"][topic]
        assert d["retention.ms"]["value"] == "3600000" and d["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"

        p = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for _ in range(3):
            p.send(topic, b"x").get(timeout=30)
        p.close()
        (state,) = admin.describe_producers([KTP(topic, 0)]).values()
        assert [s.last_sequence for s in state.active_producers] == [2]
        dirs = admin.describe_log_dirs({topic: [0]})
        assert dirs[0]["log_dirs"][0]["topics"][0]["partitions"][0]["partition_size"] > 0, dirs

        c = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group, auto_offset_reset="earliest",
                          enable_auto_commit=False)
        n, deadline = 0, time.monotonic() + 60
        while n < 3 and time.monotonic() < deadline:
            n += sum(len(v) for v in c.poll(1000).values())
        c.commit()
        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
        r = admin.delete_group_offsets(group, [KTP(topic, 0)])
        assert r[KTP(topic, 0)].__name__ == "GroupSubscribedToTopicError", r
        c.close()
        r = admin.delete_group_offsets(group, [KTP(topic, 0)])
        assert r[KTP(topic, 0)].__name__ == "NoError", r
        assert admin.delete_groups([group, group + "-x"]) == {group: "OK", group + "-x": "GroupIdNotFoundError"}
        r = admin.elect_leaders(0, {topic: [0]}, raise_errors=False)
        assert r.replica_election_results[0].partition_result[0].error_code == KafkaError.ELECTION_NOT_NEEDED
    finally:
        admin.close()
