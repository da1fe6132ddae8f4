"""kafkajs 2.2.4 (npm; tests/node/package-lock.json, installed by `make kafkajs`) against a
real `canopy serve`: admin create/delete, an idempotent producer with each codec kafkajs
has built in (none, gzip: snappy/lz4/zstd need third-party codec packages), a consumer
group that commits and resumes, and offsets by timestamp.
"""
from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition

from .client_programs import kafkajs_script, run
from .test_go_clients import QUERIES, STAMPS, _expected, _kafka_python_offsets, _topics

pytestmark = pytest.mark.timeout(240)

QUIET = {"KAFKAJS_NO_PARTITIONER_WARNING": "1"}


@pytest.fixture(scope="module")
def kafkajs():
    return kafkajs_script()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _js(kafkajs, broker, *args) -> dict:
    return run([*kafkajs, args[0], "--broker", broker.bootstrap, *args[1:]], env=QUIET)


def test_kafkajs_admin_idempotent_producer_codecs_and_delete(broker, kafkajs):
    topic = _name("kafkajs")
    assert _js(kafkajs, broker, "create", "--topic", topic, "--partitions", "2") == \
        {"created": True, "partitions": 2}
    base = int(time.time() * 1000) - 60_000
    expected = []
    for codec in ("none", "gzip"):
        r = _js(kafkajs, broker, "produce", "--topic", topic, "--partition", "1", "--codec", codec,
                "--n", "20", "--batch", "5", "--idempotent", "--prefix", codec,
                "--ts0", str(base + len(expected)), "--step", "1")
        assert r == {"offsets": list(range(len(expected), len(expected) + 20))}, (codec, r)
        expected += [(b"k%d" % i, b"%s%d" % (codec.encode(), i), [("h", b"x%d" % i)])
                     for i in range(20)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             fetch_max_wait_ms=200)
    tp = TopicPartition(topic, 1)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(expected) and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                got.extend(recs)
    finally:
        consumer.close()
    assert [(m.key, m.value, list(m.headers)) for m in got] == expected
    assert [m.timestamp for m in got] == [base + i for i in range(40)]
    r = _js(kafkajs, broker, "delete", "--topic", topic)
    assert topic not in r["topics"]
    assert topic not in _topics(broker)


def test_kafkajs_consumer_group_commits_and_resumes(broker, kafkajs):
    topic, group = _name("kafkajs-grp"), _name("g")
    _js(kafkajs, broker, "create", "--topic", topic)
    assert _js(kafkajs, broker, "produce", "--topic", topic, "--n", "30", "--batch", "10",
               "--codec", "gzip")["offsets"] == list(range(30))
    first = _js(kafkajs, broker, "group", "--topic", topic, "--group", group, "--n", "12")
    assert first == {"values": ["v%d" % i for i in range(12)]}, first
    assert _js(kafkajs, broker, "committed", "--topic", topic, "--group", group) == \
        {"offsets": [[0, 12]]}
    second = _js(kafkajs, broker, "group", "--topic", topic, "--group", group, "--n", "18")
    assert second == {"values": ["v%d" % i for i in range(12, 30)]}, second
    assert _js(kafkajs, broker, "committed", "--topic", topic, "--group", group) == \
        {"offsets": [[0, 30]]}


def test_kafkajs_offsets_by_timestamp(broker, kafkajs):
    topic = _name("kafkajs-ts")
    _js(kafkajs, broker, "create", "--topic", topic)
    # Out-of-order timestamps, one record per batch (kafkajs fills maxTimestamp correctly).
    for j, ts in enumerate(STAMPS):
        r = _js(kafkajs, broker, "produce", "--topic", topic, "--n", "1", "--ts0", str(ts),
                "--prefix", "x%d-" % j)
        assert r == {"offsets": [j]}, r
    expected = {q: _expected(q) for q in QUERIES}
    r = _js(kafkajs, broker, "offsets", "--topic", topic, "--times", ",".join(map(str, QUERIES)))
    # kafkajs answers a timestamp after the last record with the high watermark, not -1
    # (its admin replaces -1 by the latest offset); canopy's own answer is -1 (checked by
    # kafka-python below).
    answers = {int(k): v for k, v in r["offsets"].items()}
    assert answers == {q: (len(STAMPS) if e == -1 else e) for q, e in expected.items()}, answers
    assert _kafka_python_offsets(broker, topic) == expected
