"""Go clients against a real `canopy serve`: Shopify/sarama 1.22 and segmentio/kafka-go
0.2.1, the versions Debian ships (golang-github-shopify-sarama-dev,
golang-github-segmentio-kafka-go-dev), compiled in GOPATH mode from tests/go/.

sarama needs ``Version >= V0_11_0_0`` for record batches v2 (its default 0.8.2 writes
magic-0 message sets, refused as by Kafka 4); the programs use V2_1_0_0. Its producer
leaves the batch header's maxTimestamp at -1, so offsets for times depend on the broker
recomputing it (issue 14), and its offset manager commits with OffsetCommit v1.
kafka-go 0.2 only speaks magic-1 message sets (Produce v2, Fetch v2): see FINDINGS.md.
"""
from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

from .client_programs import build_go_program, run
from .rawclient import RawClient

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def sarama():
    return build_go_program("sarama-check", "github.com/Shopify/sarama")


@pytest.fixture(scope="module")
def kafkago():
    return build_go_program("kafkago-check", "github.com/segmentio/kafka-go")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _read_all(broker, topic, partition, expected, timeout=30.0):
    """Every record of one partition, via kafka-python (an independent reader)."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=200)
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend(recs)
        assert len(out) == expected, f"read {len(out)} of {expected} from {topic}-{partition}"
        return out
    finally:
        consumer.close()


def _topics(broker) -> set:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _committed(broker, group, topic, partition) -> int:
    c = RawClient(broker.bootstrap)
    try:
        r = c.request(ApiKey.OFFSET_FETCH, 1, {"group_id": group, "topics": [
            {"name": topic, "partition_indexes": [partition]}]})
        return r["topics"][0]["partitions"][0]["committed_offset"]
    finally:
        c.close()


def test_sarama_admin_idempotent_produce_each_codec_and_delete(broker, sarama):
    b = ["-brokers", broker.bootstrap]
    topic = _name("sarama")
    r = run([sarama, "create", *b, "-topic", topic, "-partitions", "2"])
    assert r == {"ok": True, "partitions": 2, "topic_error": 0}, r
    expected = []
    for codec in ("none", "gzip", "snappy", "lz4"):
        # 5 records per SendMessages call: one v2 batch each, with sequence numbers.
        r = run([sarama, "produce", *b, "-topic", topic, "-partition", "1", "-codec", codec,
                 "-n", "10", "-batch", "5", "-idempotent", "-prefix", codec])
        assert r == {"offsets": list(range(len(expected), len(expected) + 10))}, (codec, r)
        expected += [(b"k%d" % i, b"%s%d" % (codec.encode(), i)) for i in range(10)]
    # sarama 1.22 sends zstd in Produce v3; zstd needs v7+ (KIP-110) and Kafka answers
    # UNSUPPORTED_COMPRESSION_TYPE, as canopy does (FINDINGS.md).
    r = run([sarama, "produce", *b, "-topic", topic, "-partition", "1", "-codec", "zstd", "-n", "1"])
    assert "does not support the compression type" in r["error"], r
    got = _read_all(broker, topic, 1, len(expected))
    assert [(m.key, m.value) for m in got] == expected
    assert [m.offset for m in got] == list(range(len(expected)))
    r = run([sarama, "delete", *b, "-topic", topic])
    assert r.get("ok") and r.get("topic_error") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, r
    assert topic not in _topics(broker)


def test_sarama_consumer_group_commits_and_resumes(broker, sarama):
    b = ["-brokers", broker.bootstrap]
    topic, group = _name("sarama-grp"), _name("g")
    run([sarama, "create", *b, "-topic", topic])
    assert run([sarama, "produce", *b, "-topic", topic, "-n", "30", "-batch", "10",
                "-codec", "gzip"])["offsets"] == list(range(30))
    first = run([sarama, "group", *b, "-topic", topic, "-group", group, "-n", "12"])
    assert first == {"values": ["v%d" % i for i in range(12)]}, first
    # The offset manager's commit (OffsetCommit v1) arrived: before issue 14 the broker
    # closed the connection and sarama dropped the commit without telling the application.
    assert _committed(broker, group, topic, 0) == 12
    second = run([sarama, "group", *b, "-topic", topic, "-group", group, "-n", "18"])
    assert second == {"values": ["v%d" % i for i in range(12, 30)]}, second
    assert _committed(broker, group, topic, 0) == 30


# Timestamps out of order inside batches, so "first record with timestamp >= T" is not
# simply a batch boundary: ts[j] = T0 + 10 * ((7 * j) % 20) for 20 records.
T0 = 1_700_000_000_000
STAMPS = [T0 + 10 * ((7 * j) % 20) for j in range(20)]
QUERIES = [T0 - 5, T0, T0 + 1, T0 + 55, T0 + 100, T0 + 185, T0 + 190, T0 + 191]


def _expected(query: int) -> int:
    return next((j for j, ts in enumerate(STAMPS) if ts >= query), -1)


def _kafka_python_produce(broker, topic):
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20)
    try:
        futures = [producer.send(topic, key=b"k%d" % j, value=b"v%d" % j, partition=0,
                                 timestamp_ms=ts) for j, ts in enumerate(STAMPS)]
        producer.flush(timeout=30)
        assert [f.get(timeout=30).offset for f in futures] == list(range(len(STAMPS)))
    finally:
        producer.close(timeout=10)


def _kafka_python_offsets(broker, topic) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    try:
        out = {}
        for q in QUERIES:
            hit = consumer.offsets_for_times({tp: q}, timeout_ms=15000)[tp]
            out[q] = -1 if hit is None else hit.offset
        return out
    finally:
        consumer.close()


def test_sarama_topic_answers_offsets_for_times_like_a_kafka_python_topic(broker, sarama):
    b = ["-brokers", broker.bootstrap]
    by_sarama, by_kp = _name("ts-sarama"), _name("ts-kp")
    run([sarama, "create", *b, "-topic", by_sarama])
    run([sarama, "create", *b, "-topic", by_kp])
    # Same records, same timestamps: sarama in batches of 5 (header maxTimestamp -1),
    # kafka-python in whatever batches linger gives (headers filled in).
    r = run([sarama, "produce", *b, "-topic", by_sarama, "-batch", "5",
             "-stamps", ",".join(map(str, STAMPS))])
    assert r == {"offsets": list(range(len(STAMPS)))}, r
    _kafka_python_produce(broker, by_kp)
    expected = {q: _expected(q) for q in QUERIES}
    times = ",".join(str(q) for q in QUERIES)
    for topic in (by_sarama, by_kp):
        answers = run([sarama, "offsets", *b, "-topic", topic, "-times", times])["offsets"]
        assert {int(k): v for k, v in answers.items()} == expected, topic
        assert _kafka_python_offsets(broker, topic) == expected, topic
    # Records keep their own timestamps on fetch.
    got = _read_all(broker, by_sarama, 0, len(STAMPS))
    assert [m.timestamp for m in got] == STAMPS


def test_kafka_go_admin_and_offsets_for_times(broker, kafkago):
    b = ["-broker", broker.bootstrap]
    topic = _name("kafka-go")
    assert run([kafkago, "create", *b, "-topic", topic, "-partitions", "2"]) == {"ok": True}
    assert run([kafkago, "partitions", *b, "-topic", topic]) == {"partitions": [0, 1]}
    _kafka_python_produce(broker, topic)
    r = run([kafkago, "offsets", *b, "-topic", topic, "-times", ",".join(map(str, QUERIES))])
    assert (r["first"], r["last"]) == (0, len(STAMPS)), r
    assert {int(k): v for k, v in r["offsets"].items()} == {q: _expected(q) for q in QUERIES}
    # kafka-go 0.2 writes magic-1 message sets with Produce v2: refused per partition with
    # UNSUPPORTED_FOR_MESSAGE_FORMAT, and the error reaches the application (FINDINGS.md).
    r = run([kafkago, "produce", *b, "-topic", topic])
    assert r["error"].startswith("[43]"), r
    assert run([kafkago, "delete", *b, "-topic", topic]) == {"ok": True}
    assert topic not in _topics(broker)
