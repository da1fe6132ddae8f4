"""The rest of Spark's Kafka connector paths, replayed with the Java client against canopy
(tests/java/SparkLikeClient.java; compiled per kafka-clients version by the `java` fixture of
test_java_client.py):

  * subscribePattern: the driver's Admin.listTopics + describeTopics (list-pattern);
  * the executors' KafkaDataConsumer.get over a range: seek → poll, position and
    seekToBeginning/seekToEnd after every poll, empty polls (spark-get);
  * data loss: a range cut by DeleteRecords or by retention → OffsetOutOfRangeException with
    auto.offset.reset=none; failOnDataLoss=true fails the task, false resumes at the new log
    start and skips exactly the missing offsets.
"""
from __future__ import annotations

import time
import uuid


from tests.e2e.test_java_client import (  # noqa: F401  (the `java` fixture)
    _no_slf4j,
    java,
    key,
    record_crc,
    value,
)


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kv(res) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in res.lines()[-1].split())


def produce(java, broker, topic, n, partition=0):
    res = java.run("produce", broker.bootstrap, topic, n, "--partition", partition, broker=broker)
    assert res.kv_lines()[0] == {"acked": str(n)}


def test_subscribe_pattern_lists_matching_topics(java, broker):
    # SubscribePatternStrategy: Admin.listTopics, regex *found* in the name, describeTopics.
    run = uuid.uuid4().hex[:6]
    for t, parts in ((f"clicks-{run}-eu", 2), (f"clicks-{run}-us", 3), (f"views-{run}", 1)):
        java.run("create-topic", broker.bootstrap, t, parts, broker=broker)
    res = java.run("list-pattern", broker.bootstrap, f"clicks-{run}-.*", broker=broker)
    assert res.kv_lines() == [{"topic": f"clicks-{run}-eu", "partitions": "2"},
                              {"topic": f"clicks-{run}-us", "partitions": "3"}]
    # findFirstIn semantics: an unanchored fragment selects every topic containing it
    res = java.run("list-pattern", broker.bootstrap, run, broker=broker)
    assert [d["topic"] for d in res.kv_lines()] == sorted(
        [f"clicks-{run}-eu", f"clicks-{run}-us", f"views-{run}"])
    # internal topics (__consumer_offsets) are never listed
    res = java.run("list-pattern", broker.bootstrap, "^__", broker=broker)
    assert res.kv_lines() == []


def test_executor_get_reads_range_exactly(java, broker):
    topic, n = topic_name("spark-get"), 3000
    produce(java, broker, topic, n)
    for lo, hi in ((0, n), (17, 2500), (n - 1, n)):
        res = java.run("spark-get", broker.bootstrap, topic, 0, lo, hi, broker=broker)
        got = kv(res)
        assert got == {"count": str(hi - lo), "first": str(lo), "last": str(hi - 1),
                       "crc": record_crc((i, key(i), value(i)) for i in range(lo, hi)),
                       "skipped": "0", "polls": got["polls"]}, _no_slf4j(res.stderr)[-2000:]


def test_empty_poll_at_high_watermark_is_out_of_range(java, broker):
    # A range past the end (a topic recreated smaller, say): the poll comes back empty,
    # position/seekToBeginning/seekToEnd show offset >= latest, Spark raises
    # OffsetOutOfRange: fatal with failOnDataLoss=true, skipped (and logged) with false.
    topic = topic_name("spark-empty")
    produce(java, broker, topic, 100)
    res = java.run("spark-get", broker.bootstrap, topic, 0, 100, 110, "--poll-timeout-ms", 2000,
                   check=False, broker=broker)
    assert res.returncode == 4, (res.stdout, _no_slf4j(res.stderr)[-2000:])
    assert "cause=org.apache.kafka.clients.consumer.OffsetOutOfRangeException" in res.stderr
    res = java.run("spark-get", broker.bootstrap, topic, 0, 100, 110, "--poll-timeout-ms", 2000,
                   "--fail-on-data-loss", "false", broker=broker)
    assert kv(res)["count"] == "0" and kv(res)["skipped"] == "10"
    assert "available range [0, 100)" in res.stderr


def test_range_cut_by_delete_records(java, broker):
    topic, n, cut = topic_name("spark-cut"), 1000, 400
    produce(java, broker, topic, n)
    res = java.run("delete-records", broker.bootstrap, topic, 0, cut, broker=broker)
    assert res.kv_lines() == [{"low_watermark": str(cut)}]
    assert java.run("offset-range", broker.bootstrap, topic, 0, broker=broker).kv_lines()[-1] == {
        "earliest": str(cut), "latest": str(n)}

    lo, hi = 250, 600  # a planned range whose head was deleted after planning
    # failOnDataLoss=true: the poll raises OffsetOutOfRangeException (auto.offset.reset=none)
    # and the task fails
    res = java.run("spark-get", broker.bootstrap, topic, 0, lo, hi, check=False, broker=broker)
    assert res.returncode == 4, (res.stdout, _no_slf4j(res.stderr)[-2000:])
    assert "cause=org.apache.kafka.clients.consumer.OffsetOutOfRangeException" in res.stderr
    # failOnDataLoss=false: resume at the new log start, skip exactly the deleted offsets
    res = java.run("spark-get", broker.bootstrap, topic, 0, lo, hi, "--fail-on-data-loss", "false",
                   broker=broker)
    got = kv(res)
    assert got["count"] == str(hi - cut) and got["first"] == str(cut)
    assert got["last"] == str(hi - 1) and got["skipped"] == str(cut - lo)
    assert got["crc"] == record_crc((i, key(i), value(i)) for i in range(cut, hi))
    # a range wholly below the new log start: nothing, all of it skipped
    res = java.run("spark-get", broker.bootstrap, topic, 0, 10, 20, "--fail-on-data-loss", "false",
                   broker=broker)
    assert kv(res)["count"] == "0" and kv(res)["skipped"] == "10"


def test_range_deleted_by_retention(java, broker_factory):
    # Retention deletes whole old segments and advances the log start offset; an executor
    # asked for the deleted offsets must see OffsetOutOfRange, then resume at the new start.
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = broker_factory("retention", env={"CANOPY_RETENTION_CHECK_INTERVAL_MS": "300"})
    topic, n = topic_name("spark-retention"), 600
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1, 1, config={
            "segment.bytes": "8192", "retention.ms": "60000"})]).values():
        f.result(30)
    old = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000  # an hour ago: past retention
    res = java.run("produce", broker.bootstrap, topic, n, "--partition", 0, "--ts-base", old,
                   "--prop", "batch.size=4096", broker=broker)
    assert res.kv_lines()[0] == {"acked": str(n)}
    deadline = time.monotonic() + 30
    while True:
        rng = java.run("offset-range", broker.bootstrap, topic, 0, broker=broker).kv_lines()[-1]
        if int(rng["earliest"]) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    start = int(rng["earliest"])
    assert 0 < start < n and rng["latest"] == str(n), rng  # the active segment stays

    res = java.run("spark-get", broker.bootstrap, topic, 0, 0, n, check=False, broker=broker)
    assert res.returncode == 4, (res.stdout, _no_slf4j(res.stderr)[-2000:])
    res = java.run("spark-get", broker.bootstrap, topic, 0, 0, n, "--fail-on-data-loss", "false",
                   broker=broker)
    got = kv(res)
    assert got["first"] == str(start) and got["count"] == str(n - start)
    assert got["skipped"] == str(start)
    assert got["crc"] == record_crc((i, key(i), value(i)) for i in range(start, n))
