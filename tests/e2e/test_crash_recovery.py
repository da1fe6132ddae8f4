"""kill -9 of `canopy serve` while producers with acks=all are running.

After a restart on the same data directory (no repair step, no flags) every acknowledged
message is there at the offset it was acknowledged with, offsets are contiguous from 0, and
the log keeps accepting appends where it left off.
"""
from __future__ import annotations

import re
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.timeout(240)


def unique_topic(request, prefix="crash") -> str:
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]
    return f"{prefix}-{name}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                        operation_timeout=15, request_timeout=15)[topic].result(timeout=20)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if md and md.error is None and len(md.partitions) == partitions:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not visible")


def read_partition(bootstrap, topic, partition, timeout=60.0):
    """Every record of one partition from offset 0 to the high watermark:
    [(offset, value)]."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)
        assert low == 0, f"log start offset {low} after recovery (nothing was deleted)"
        consumer.assign([TopicPartition(topic, partition, 0)])
        got = []
        deadline = time.monotonic() + timeout
        while (not got or got[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or (msg.error() and msg.error().code() == -191):  # _PARTITION_EOF
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.value()))
        return got, high
    finally:
        consumer.close()


class AckLog:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed: list[str] = []

    def __call__(self, err, msg):
        with self.lock:
            if err is None:
                assert msg.value() not in self.acked, f"acked twice: {msg.value()}"
                self.acked[msg.value()] = (msg.partition(), msg.offset())
            else:
                self.failed.append(str(err))

    def count(self):
        with self.lock:
            return len(self.acked)


def test_kill9_while_idempotent_acks_all_producer_runs(broker_factory, request):
    """An idempotent acks=all producer keeps running through three kill -9 / restart cycles.
    Retries of batches that were in flight at the crash must not duplicate anything."""
    broker = broker_factory("crash")
    port = broker.port
    topic = unique_topic(request)
    partitions = 2
    create_topic(broker.bootstrap, topic, partitions)

    acks = AckLog()
    stop = threading.Event()
    sent = []

    def produce_loop():
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 2,
                             "message.timeout.ms": 90000, "reconnect.backoff.max.ms": 500,
                             "retry.backoff.ms": 100})
        i = 0
        while not stop.is_set():
            value = b"crash-%07d" % i
            try:
                producer.produce(topic, value=value, partition=i % partitions,
                                 on_delivery=acks)
                sent.append(value)
                i += 1
            except BufferError:
                producer.poll(0.05)
                continue
            if i % 100 == 0:
                producer.poll(0)
                time.sleep(0.002)  # keep the rate moderate: ~tens of thousands/s at most
        remaining = producer.flush(90)
        assert remaining == 0, f"{remaining} messages undelivered at the end"

    thread = threading.Thread(target=produce_loop, daemon=True)
    thread.start()
    try:
        for cycle in range(3):
            target = acks.count() + 3000
            deadline = time.monotonic() + 60
            while acks.count() < target and time.monotonic() < deadline and thread.is_alive():
                time.sleep(0.05)
            assert acks.count() >= target, (
                f"cycle {cycle}: producer stalled at {acks.count()} acks; failures "
                f"{acks.failed[:5]}\n{broker.log_text()}")
            broker.kill9()
            time.sleep(0.3)
            broker = broker_factory("crash", port=port)
        # Let it run a little against the recovered broker, then finish.
        target = acks.count() + 3000
        deadline = time.monotonic() + 60
        while acks.count() < target and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive(), "producer did not finish flushing"
    assert acks.failed == [], f"delivery failures: {acks.failed[:10]}"
    assert len(acks.acked) == len(sent)

    for p in range(partitions):
        records, high = read_partition(broker.bootstrap, topic, p)
        offsets = [o for o, _ in records]
        assert offsets == list(range(high)), f"partition {p}: offsets not contiguous from 0"
        values = [v for _, v in records]
        assert len(set(values)) == len(values), f"partition {p}: duplicated records"
        mine = {v: off for v, (q, off) in acks.acked.items() if q == p}
        stored = {v: o for o, v in records}
        missing = [v for v in mine if v not in stored]
        assert not missing, f"partition {p}: {len(missing)} acknowledged records lost"
        moved = [(v, off, stored[v]) for v, off in mine.items() if stored[v] != off]
        assert not moved, f"partition {p}: acknowledged records at other offsets: {moved[:5]}"
        # In-partition order is the send order.
        assert values == sorted(values)


def test_kill9_then_restart_keeps_acknowledged_and_appends_after(broker_factory, request):
    """kafka-python, acks=all, not idempotent: stop producing at the crash, restart, check
    the acknowledged prefix, and check new appends continue at the high watermark."""
    from kafka import KafkaProducer

    broker = broker_factory("crash2")
    topic = unique_topic(request)
    create_topic(broker.bootstrap, topic, 1)

    acked: dict[bytes, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def produce_loop():
        # Short delivery timeout: once the broker is gone, pending batches expire within
        # seconds, so close() completes instead of leaving the sender thread behind.
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                 enable_idempotence=False, linger_ms=1, retries=0,
                                 request_timeout_ms=2000, delivery_timeout_ms=3000,
                                 max_block_ms=2000)
        i = 0
        while not stop.is_set():
            value = b"kp-%07d" % i
            i += 1

            def ok(md, value=value):
                with lock:
                    acked[value] = md.offset
            try:
                producer.send(topic, value=value, partition=0).add_callback(ok)
            except Exception:
                break
            if i % 200 == 0:
                time.sleep(0.002)
        producer.close(timeout=15)

    thread = threading.Thread(target=produce_loop, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(acked) < 5000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acked) >= 5000, f"only {len(acked)} acks before the crash\n{broker.log_text()}"
    broker.kill9()
    with lock:
        acked_at_crash = dict(acked)
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), "producer thread still running after the crash"

    # Restart on a new port: batches the abandoned producer still holds (its close() may
    # time out while the broker is down) cannot reach the restarted broker and race the
    # checks below.
    broker = broker_factory("crash2")
    records, high = read_partition(broker.bootstrap, topic, 0)
    assert [o for o, _ in records] == list(range(high))
    stored = {v: o for o, v in records}
    lost = [v for v in acked_at_crash if v not in stored]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
    assert all(stored[v] == off for v, off in acked_at_crash.items())
    assert high >= len(acked_at_crash)

    # The recovered log accepts appends right after its last record.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    offsets = []
    for i in range(10):
        producer.produce(topic, value=b"after-%d" % i, partition=0,
                         on_delivery=lambda err, msg: offsets.append(
                             msg.offset() if err is None else str(err)))
    assert producer.flush(30) == 0
    assert offsets == list(range(high, high + 10))


def test_committed_offsets_survive_kill9(broker_factory, request):
    broker = broker_factory("crash3")
    port = broker.port
    topic = unique_topic(request)
    group = f"crashg-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(50):
        producer.produce(topic, value=b"c%d" % i, partition=0)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    consumer.commit(offsets=[TopicPartition(topic, 0, 37)], asynchronous=False)
    consumer.close()

    broker.kill9()
    broker = broker_factory("crash3", port=port)

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=15)
        assert tp.offset == 37
        consumer.subscribe([topic])
        msg = None
        deadline = time.monotonic() + 30
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
        assert msg is not None and msg.error() is None, msg and msg.error()
        assert (msg.offset(), msg.value()) == (37, b"c37")
    finally:
        consumer.close()


def test_kill9_right_after_create_topics_keeps_every_partition(broker_factory, request):
    """A topic is acknowledged once topic.json and the directories above it are fsynced;
    its partitions get their directories and segments at their first append. kill -9 the
    moment CreateTopics returns: after a restart the topic has every partition, empty,
    and they take appends; those survive a second kill -9 (the lazily made files)."""
    parts = 300
    broker = broker_factory("create9", extra_args=["--flush", "always"])
    topic = unique_topic(request, "create9")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=1)],
                        operation_timeout=30, request_timeout=30)[topic].result(timeout=60)
    broker.kill9()

    broker = broker_factory("create9", extra_args=["--flush", "always"])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = admin.list_topics(topic=topic, timeout=15).topics[topic]
    assert md.error is None, md.error
    assert sorted(md.partitions) == list(range(parts))
    assert all(p.leader == 0 and p.error is None for p in md.partitions.values())
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"v-{uuid.uuid4().hex}"})
    try:
        for p in (0, parts // 2, parts - 1):
            assert consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15) == (0, 0)
    finally:
        consumer.close()

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    acked = []
    for p in range(parts):
        producer.produce(topic, value=b"p%d" % p, partition=p,
                         on_delivery=lambda err, msg: acked.append(
                             (msg.partition(), msg.offset()) if err is None else str(err)))
    assert producer.flush(60) == 0
    assert sorted(acked) == [(p, 0) for p in range(parts)]
    broker.kill9()

    broker = broker_factory("create9")
    for p in (0, parts // 2, parts - 1):
        records, high = read_partition(broker.bootstrap, topic, p)
        assert high == 1 and records == [(0, b"p%d" % p)], (p, records, high)
