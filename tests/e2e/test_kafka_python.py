"""kafka-python 3.0.x against a real `canopy serve`: producer (idempotent default, acks,
codecs), group consumer commit/resume, assign + seek, offsets_for_times, and the admin client.

Every consumer has a consumer_timeout_ms / poll deadline and every test a pytest timeout, so a
broker that stops answering fails the test instead of hanging it.
"""
from __future__ import annotations

import logging
import re
import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.structs import OffsetAndMetadata

pytestmark = pytest.mark.timeout(120)


def unique_topic(request, prefix="kp") -> str:
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]
    return f"{prefix}-{name}-{uuid.uuid4().hex[:8]}"


def admin_for(broker) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)


def create_topic(broker, topic, partitions=1, configs=None):
    admin = admin_for(broker)
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1,
                                     "configs": configs or {}}},
                            wait_for_metadata=True)
    finally:
        admin.close()


def consume(broker, topic, expected, *, partitions=None, timeout=30.0, **cfg):
    """Read `expected` records from the beginning of `topic` (no group), then make sure no
    extra record follows. Fails on timeout."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=200, **cfg)
    try:
        parts = partitions or sorted(consumer.partitions_for_topic(topic) or {0})
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records = []
        deadline = time.monotonic() + timeout
        while len(records) < expected and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                records.extend(recs)
        assert len(records) >= expected, (
            f"read {len(records)} of {expected} records from {topic} in {timeout}s")
        # Nothing beyond what was produced.
        extra = consumer.poll(timeout_ms=500)
        assert not any(extra.values()), f"unexpected extra records: {extra}"
        assert len(records) == expected
        return records
    finally:
        consumer.close()


class ErrorLog(logging.Handler):
    """Collects ERROR records of the kafka-python loggers while attached."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []
        self.logger = logging.getLogger("kafka")
        self.old_level = self.logger.level
        self.logger.setLevel(min(self.old_level or logging.ERROR, logging.ERROR))
        self.logger.addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def close(self):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.old_level)
        super().close()


# --------------------------------------------------------------------------- producer


def test_default_producer_is_idempotent(broker, request):
    # The topic is auto-created by the producer's Metadata request; its partition count is
    # the broker default, so offsets are checked per partition.
    topic = unique_topic(request)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    try:
        futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i) for i in range(1000)]
        producer.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futures]
        # The default in kafka-python 3 is idempotent (acks=all + InitProducerId); the broker's
        # ApiVersions must not make the client fall back to a non-idempotent producer.
        assert producer.config["enable_idempotence"] is True
        assert producer.config["acks"] == -1
        pid = producer._transaction_manager.producer_id_and_epoch
        assert pid.producer_id >= 0, f"InitProducerId gave no producer id: {pid}"
    finally:
        producer.close(timeout=10)
    sent = {}  # partition -> [(offset, key, value)] in send order
    for i, m in enumerate(metas):
        sent.setdefault(m.partition, []).append((m.offset, b"k%d" % i, b"v%d" % i))
    for p, rows in sent.items():
        assert [o for o, _, _ in rows] == list(range(len(rows))), f"partition {p} offsets"
    records = consume(broker, topic, 1000)
    got = {}
    for r in records:
        got.setdefault(r.partition, []).append((r.offset, r.key, r.value))
    assert got == sent


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker, request, acks):
    topic = unique_topic(request)
    create_topic(broker, topic)
    errors = ErrorLog()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks=acks, linger_ms=2)
    try:
        futures = [producer.send(topic, value=b"acks-%d" % i) for i in range(300)]
        producer.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futures]
        if acks == 0:
            # acks=0: the broker sends no response, so the client cannot know offsets.
            # The connection must still be usable afterwards (a broker that answers an
            # acks=0 produce confuses the client's in-flight request queue).
            assert len(metas) == 300
            assert producer.partitions_for(topic) == {0}
        else:
            assert [m.offset for m in metas] == list(range(300))
    finally:
        producer.close(timeout=10)
        errors.close()
    # A response to an acks=0 produce arrives with no in-flight request and makes the client
    # drop the connection ("Received response with no in-flight-requests!").
    lost = [m for m in errors.messages if "Connection lost" in m]
    assert lost == [], lost
    records = consume(broker, topic, 300)
    assert [r.value for r in records] == [b"acks-%d" % i for i in range(300)]
    assert [r.offset for r in records] == list(range(300))


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(broker, request, codec):
    topic = unique_topic(request)
    create_topic(broker, topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec,
                             linger_ms=20, batch_size=64 * 1024)
    values = [(b"%s record %05d " % (codec.encode(), i)) * 20 for i in range(2000)]
    try:
        futures = [producer.send(topic, key=str(i).encode(), value=v,
                                 headers=[("h", str(i).encode())])
                   for i, v in enumerate(values)]
        producer.flush(timeout=30)
        assert [f.get(timeout=30).offset for f in futures] == list(range(len(values)))
    finally:
        producer.close(timeout=10)
    records = consume(broker, topic, len(values))
    assert [r.value for r in records] == values
    assert [r.key for r in records] == [str(i).encode() for i in range(len(values))]
    assert [r.headers for r in records] == [[("h", str(i).encode())] for i in range(len(values))]
    # Batches were really compressed (several records per batch) and the consumer can still
    # start in the middle of a compressed batch.
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 1234)
        got = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=500).get(tp, [])
        assert got and got[0].offset == 1234 and got[0].value == values[1234]
    finally:
        consumer.close()


def test_log_append_time_topic(broker, request):
    topic = unique_topic(request)
    create_topic(broker, topic, configs={"message.timestamp.type": "LogAppendTime"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    before = int(time.time() * 1000)
    try:
        futures = [producer.send(topic, value=b"lat-%d" % i, timestamp_ms=1_000_000 + i)
                   for i in range(20)]
        producer.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    after = int(time.time() * 1000)
    # The Produce response carries log_append_time_ms; the client reports it as the timestamp.
    assert all(before - 1000 <= m.timestamp <= after + 1000 for m in metas), \
        [m.timestamp for m in metas]
    records = consume(broker, topic, 20)
    assert all(r.timestamp_type == 1 for r in records)  # 1 = LogAppendTime
    assert all(before - 1000 <= r.timestamp <= after + 1000 for r in records)
    assert [r.value for r in records] == [b"lat-%d" % i for i in range(20)]


def test_message_too_large(broker, request):
    from kafka.errors import MessageSizeTooLargeError

    topic = unique_topic(request)
    create_topic(broker, topic, configs={"max.message.bytes": "2000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        big = producer.send(topic, value=b"x" * 5000)
        with pytest.raises(MessageSizeTooLargeError):
            big.get(timeout=30)
    finally:
        producer.close(timeout=10)
    # kafka-python 3's idempotent producer treats a rejected batch as fatal (every later send
    # fails locally with the same error), so a second producer checks the log is unharmed.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        small = producer.send(topic, value=b"small").get(timeout=30)
        assert small.offset == 0
    finally:
        producer.close(timeout=10)
    assert [r.value for r in consume(broker, topic, 1)] == [b"small"]


# --------------------------------------------------------------------------- consumer


def test_group_consumer_commits_and_resumes(broker, request):
    topic = unique_topic(request)
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(100):
        producer.send(topic, value=b"m%d" % i)
    producer.flush(timeout=30)
    producer.close(timeout=10)
    tp = TopicPartition(topic, 0)

    def group_consumer():
        return KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             max_poll_records=10, fetch_max_wait_ms=200,
                             session_timeout_ms=10000, heartbeat_interval_ms=1000)

    def read(consumer, n, timeout=30.0):
        records = []
        deadline = time.monotonic() + timeout
        while len(records) < n and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                records.extend(recs)
        return records

    # First member: reads at least 40 records, commits exactly offset 40 with metadata.
    c1 = group_consumer()
    try:
        first = read(c1, 40)
        assert len(first) >= 40, f"first consumer read only {len(first)} records"
        assert [r.offset for r in first[:40]] == list(range(40))
        c1.commit({tp: OffsetAndMetadata(40, "meta-40", -1)})
        committed = c1.committed(tp, metadata=True)
        assert committed.offset == 40
        assert committed.metadata == "meta-40"
    finally:
        c1.close()

    # Second member of the same group resumes at the commit, not at the beginning.
    c2 = group_consumer()
    try:
        committed = c2.committed(tp, metadata=True)
        assert (committed.offset, committed.metadata) == (40, "meta-40")
        rest = read(c2, 60)
        assert [r.offset for r in rest] == list(range(40, 100))
        assert [r.value for r in rest] == [b"m%d" % i for i in range(40, 100)]
        assert not any(c2.poll(timeout_ms=500).values())
        c2.commit()  # commits the position: 100
        assert c2.committed(tp) == 100
    finally:
        c2.close()

    # Third member: nothing left to read.
    c3 = group_consumer()
    try:
        assert c3.committed(tp) == 100
        assert read(c3, 1, timeout=3) == []
    finally:
        c3.close()


def test_assign_and_seek(broker, request):
    topic = unique_topic(request)
    create_topic(broker, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for p in (0, 1):
        for i in range(50):
            producer.send(topic, value=b"p%d-%d" % (p, i), partition=p)
    producer.flush(timeout=30)
    producer.close(timeout=10)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=200)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    try:
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 50, tp1: 50}
        consumer.assign([tp1])
        consumer.seek(tp1, 30)
        assert consumer.position(tp1) == 30
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500).get(tp1, []))
        assert [r.offset for r in got] == list(range(30, 50))
        assert [r.value for r in got] == [b"p1-%d" % i for i in range(30, 50)]
        assert consumer.position(tp1) == 50
        # Seek backwards to 0 and forwards to the end.
        consumer.seek_to_beginning(tp1)
        got = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=500).get(tp1, [])
        assert got[0].offset == 0 and got[0].value == b"p1-0"
        consumer.seek_to_end(tp1)
        assert consumer.position(tp1) == 50
        assert not any(consumer.poll(timeout_ms=500).values())
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_offsets_for_times(broker, request, codec):
    topic = unique_topic(request)
    create_topic(broker, topic)
    base = int(time.time() * 1000) - 600_000
    # Several records per batch (linger), so a lookup must be exact inside a batch.
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec,
                             linger_ms=50)
    futures = [producer.send(topic, value=b"t%d" % i, timestamp_ms=base + 10 * i)
               for i in range(100)]
    producer.flush(timeout=30)
    assert [f.get(timeout=30).offset for f in futures] == list(range(100))
    producer.close(timeout=10)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    try:
        def lookup(ts):
            return consumer.offsets_for_times({tp: ts}, timeout_ms=15000)[tp]

        hit = lookup(base + 255)  # first record with timestamp >= target: i=26
        assert (hit.offset, hit.timestamp) == (26, base + 260)
        hit = lookup(base + 250)  # exact match
        assert (hit.offset, hit.timestamp) == (25, base + 250)
        hit = lookup(base - 1_000_000)
        assert (hit.offset, hit.timestamp) == (0, base)
        hit = lookup(base + 990)
        assert (hit.offset, hit.timestamp) == (99, base + 990)
        assert lookup(base + 991) is None  # after the last record: no offset
        # Timestamps round-trip through fetch.
        consumer.assign([tp])
        consumer.seek(tp, 26)
        got = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=500).get(tp, [])
        assert (got[0].offset, got[0].timestamp, got[0].value) == (26, base + 260, b"t26")
    finally:
        consumer.close()


# --------------------------------------------------------------------------- admin


def test_admin_topics(broker, request):
    topic = unique_topic(request)
    admin = admin_for(broker)
    try:
        result = admin.create_topics(
            {topic: {"num_partitions": 3, "replication_factor": 1,
                     "configs": {"retention.ms": "3600000", "max.message.bytes": "2000000",
                                 "segment.bytes": "10485760"}}},
            wait_for_metadata=True)
        assert [t["error_code"] for t in result["topics"]] == [0]
        assert topic in admin.list_topics()

        [desc] = admin.describe_topics([topic])
        assert desc["name"] == topic and desc["error_code"] == 0
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1, 2]
        assert all(p["leader_id"] == 0 for p in desc["partitions"])

        # Creating it again is an error.
        again = admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}},
                                    raise_errors=False)
        assert [t["error_code"] for t in again["topics"]] == [36]  # TOPIC_ALREADY_EXISTS

        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        topic_configs = configs["topic"][topic]
        assert topic_configs["retention.ms"]["value"] == "3600000"
        assert topic_configs["max.message.bytes"]["value"] == "2000000"
        assert topic_configs["segment.bytes"]["value"] == "10485760"

        admin.create_partitions({topic: 5})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            [desc] = admin.describe_topics([topic])
            if len(desc["partitions"]) == 5:
                break
            time.sleep(0.2)
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1, 2, 3, 4]

        # delete_records advances the log start offset.
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for i in range(10):
            producer.send(topic, value=b"d%d" % i, partition=4)
        producer.flush(timeout=30)
        producer.close(timeout=10)
        tp = TopicPartition(topic, 4)
        deleted = admin.delete_records({tp: 4})
        assert deleted[tp]["low_watermark"] == 4
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
        try:
            assert consumer.beginning_offsets([tp]) == {tp: 4}
            assert consumer.end_offsets([tp]) == {tp: 10}
        finally:
            consumer.close()
        records = consume(broker, topic, 6, partitions=[4])
        assert [r.offset for r in records] == list(range(4, 10))

        admin.delete_topics([topic])
        deadline = time.monotonic() + 10
        while topic in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert topic not in admin.list_topics()
    finally:
        admin.close()


def test_admin_consumer_groups(broker, request):
    topic = unique_topic(request)
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(20):
        producer.send(topic, value=b"x%d" % i, partition=i % 2)
    producer.flush(timeout=30)
    producer.close(timeout=10)

    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                             client_id="kp-groups-test", auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=200)
    admin = admin_for(broker)
    try:
        got = 0
        deadline = time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            got += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
        assert got == 20
        consumer.commit()

        groups = admin.list_groups()
        mine = [g for g in groups if g["group_id"] == group]
        assert mine, f"{group} missing from ListGroups: {groups}"
        assert mine[0]["protocol_type"] == "consumer"

        desc = admin.describe_groups([group])[group]
        assert desc["error"] is None
        assert desc["group_state"] == "Stable"
        assert desc["protocol_type"] == "consumer"
        assert len(desc["members"]) == 1
        assert desc["members"][0]["client_id"] == "kp-groups-test"

        offsets = admin.list_group_offsets(group)[group]
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 10, 1: 10}
    finally:
        consumer.close()
        admin.close()
    # After the only member leaves, the group is empty but its offsets remain.
    admin = admin_for(broker)
    try:
        desc = admin.describe_groups([group])[group]
        assert desc["group_state"] == "Empty" and desc["members"] == []
    finally:
        admin.close()
