"""confluent-kafka (bundled recent librdkafka) against a real `canopy serve`: idempotent
producer, group consumer, AdminClient, and 100 000 messages round-tripped intact.
"""
from __future__ import annotations

import hashlib
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

pytestmark = pytest.mark.timeout(240)


def unique_topic(request, prefix="ck") -> str:
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]
    return f"{prefix}-{name}-{uuid.uuid4().hex[:8]}"


def admin_for(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 10000})


def create_topic(admin: AdminClient, topic: str, partitions: int, config=None) -> None:
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=1, config=config or {})],
                                  operation_timeout=15, request_timeout=15)
    futures[topic].result(timeout=20)
    # Wait until metadata shows every partition with a leader.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if md and md.error is None and len(md.partitions) == partitions and \
                all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not ready: {md}")


class DeliveryLog:
    """Collects delivery reports; every failure is kept so the test can show it."""

    def __init__(self):
        self.ok: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.errors: list[str] = []

    def __call__(self, err, msg):
        if err is not None:
            self.errors.append(f"{err} ({msg.topic()}[{msg.partition()}])")
        else:
            self.ok.append((msg.partition(), msg.offset(), msg.value()))


def drain(producer: Producer, timeout: float = 60.0) -> None:
    remaining = producer.flush(timeout)
    assert remaining == 0, f"{remaining} messages still undelivered after {timeout}s"


def test_idempotent_producer(broker, request):
    topic = unique_topic(request)
    admin = admin_for(broker)
    create_topic(admin, topic, 2)
    log = DeliveryLog()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 30000})
    for i in range(5000):
        producer.produce(topic, key=b"k%d" % (i % 10), value=b"v%d" % i, on_delivery=log)
        producer.poll(0)
    drain(producer)
    assert log.errors == []
    assert len(log.ok) == 5000
    by_partition: dict[int, list[int]] = {}
    for p, off, _ in log.ok:
        by_partition.setdefault(p, []).append(off)
    for p, offs in by_partition.items():
        # Idempotence: no duplicates, no gaps.
        assert offs == list(range(len(offs))), f"partition {p} offsets not contiguous"
    # librdkafka only reaches the ProducerID-assigned state after InitProducerId succeeded;
    # a broker without it makes the idempotent producer fail fatally instead.
    assert producer.list_topics(topic, timeout=10).topics[topic].error is None


def test_group_consumer(broker, request):
    topic = unique_topic(request)
    group = f"ckg-{uuid.uuid4().hex[:8]}"
    admin = admin_for(broker)
    create_topic(admin, topic, 3)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(300):
        producer.produce(topic, value=b"g%d" % i, partition=i % 3)
    drain(producer)

    def consume(n, timeout=40.0):
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "session.timeout.ms": 10000})
        c.subscribe([topic])
        got = []
        deadline = time.monotonic() + timeout
        try:
            while len(got) < n and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                got.append(msg)
            if got:
                c.commit(asynchronous=False)
            committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
            # Nothing more to read once n are in.
            extra = c.poll(1.0)
            assert extra is None or extra.error() is not None and \
                extra.error().code() == KafkaError._PARTITION_EOF, extra
        finally:
            c.close()
        return got, committed

    got, committed = consume(300)
    assert len(got) == 300
    assert sorted(m.value() for m in got) == sorted(b"g%d" % i for i in range(300))
    for p in range(3):
        offs = [m.offset() for m in got if m.partition() == p]
        assert offs == list(range(100)), f"partition {p}"
    assert {tp.partition: tp.offset for tp in committed} == {0: 100, 1: 100, 2: 100}

    # A new member of the same group starts from the commits: only new messages.
    for i in range(30):
        producer.produce(topic, value=b"h%d" % i, partition=i % 3)
    drain(producer)
    got, committed = consume(30)
    assert sorted(m.value() for m in got) == sorted(b"h%d" % i for i in range(30))
    assert {tp.partition: tp.offset for tp in committed} == {0: 110, 1: 110, 2: 110}

    groups = admin.list_consumer_groups(request_timeout=10).result(timeout=15)
    assert group in [g.group_id for g in groups.valid], groups.valid
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    assert desc.group_id == group
    assert desc.members == []  # every member has left


def test_admin_client(broker, request):
    topic = unique_topic(request)
    admin = admin_for(broker)
    create_topic(admin, topic, 2, config={"retention.ms": "7200000"})

    md = admin.list_topics(timeout=10)
    assert topic in md.topics
    assert len(md.topics[topic].partitions) == 2
    assert [b.id for b in md.brokers.values()] == [0]
    assert md.controller_id == 0
    host, port = broker.bootstrap.split(":")
    assert (md.brokers[0].host, md.brokers[0].port) == (host, int(port))

    desc = admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic] \
        .result(timeout=15)
    assert desc.name == topic
    assert [p.id for p in desc.partitions] == [0, 1]
    assert all(p.leader.id == 0 for p in desc.partitions)

    cluster = admin.describe_cluster(request_timeout=10).result(timeout=15)
    assert [n.id for n in cluster.nodes] == [0]

    from confluent_kafka.admin import ConfigResource, ResourceType
    res = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([res], request_timeout=10)[res].result(timeout=15)
    assert configs["retention.ms"].value == "7200000"

    admin.create_partitions([NewPartitions(topic, 4)], operation_timeout=15,
                            request_timeout=15)[topic].result(timeout=20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(admin.list_topics(topic=topic, timeout=5).topics[topic].partitions) == 4:
            break
        time.sleep(0.2)
    assert len(admin.list_topics(topic=topic, timeout=5).topics[topic].partitions) == 4

    admin.delete_topics([topic], operation_timeout=15, request_timeout=15)[topic] \
        .result(timeout=20)
    deadline = time.monotonic() + 10
    while topic in admin.list_topics(timeout=5).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic not in admin.list_topics(timeout=5).topics


def test_100k_messages_round_trip(broker, request):
    topic = unique_topic(request)
    partitions = 4
    n = 100_000
    admin = admin_for(broker)
    create_topic(admin, topic, partitions)

    log = DeliveryLog()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "batch.size": 1 << 20,
                         "message.timeout.ms": 60000, "compression.type": "none"})
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i in range(n):
        # Values of varying size and content, so a shifted/corrupted byte changes the digest.
        value = b"%08d:" % i + hashlib.sha256(b"%d" % i).digest() * (1 + i % 7)
        p = i % partitions
        sent[p].append(value)
        while True:
            try:
                producer.produce(topic, key=b"%d" % i, value=value, partition=p,
                                 on_delivery=log)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    drain(producer, 120)
    assert log.errors == []
    assert len(log.ok) == n
    for p in range(partitions):
        delivered = sorted((off, v) for q, off, v in log.ok if q == p)
        assert [off for off, _ in delivered] == list(range(len(sent[p])))
        assert [v for _, v in delivered] == sent[p]

    consumer = Consumer({"bootstrap.servers": broker.bootstrap,
                         "group.id": f"ck100k-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "fetch.max.bytes": 8 << 20})
    consumer.subscribe([topic])
    got: dict[int, list[tuple[int, bytes, bytes]]] = {p: [] for p in range(partitions)}
    count = 0
    deadline = time.monotonic() + 120
    try:
        while count < n and time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=10000, timeout=0.5)
            for m in msgs:
                assert m.error() is None, m.error()
                got[m.partition()].append((m.offset(), m.key(), m.value()))
            count += len(msgs)
        extra = consumer.consume(num_messages=10, timeout=1.0)
        assert [m for m in extra if m.error() is None] == []
    finally:
        consumer.close()
    assert count == n, f"consumed {count} of {n} within the deadline"

    def digest(parts):
        h = hashlib.sha256()
        for p in range(partitions):
            for v in parts[p]:
                h.update(v)
        return h.hexdigest()

    for p in range(partitions):
        assert [off for off, _, _ in got[p]] == list(range(len(sent[p]))), f"partition {p} order"
        # Keys match what was sent with each value.
        assert all(k == v[:8].lstrip(b"0").rjust(1, b"0") for _, k, v in got[p])
    assert digest({p: [v for _, _, v in got[p]] for p in got}) == digest(sent)
