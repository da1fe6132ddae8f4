"""Log compaction end to end: a real `canopy serve`, confluent-kafka clients, SIGKILL.

Issue 12's proofs 1 and 2: a compacted topic with 100 000 updates over 1 000 keys and
tombstones reads back, after cleaning, as exactly the latest value per live key at its
original offset; tombstones go after delete.retention.ms; a consumer reading across a
cleaning misses no latest value; kill -9 during cleaning, in a loop, loses and corrupts
nothing; __consumer_offsets stays bounded under a group committing every 100 ms.
Long loops are behind env counts with small defaults (COMPACTION_KILL_LOOPS,
COMPACTION_OFFSETS_SECONDS).
"""
from __future__ import annotations

import os
import random
import re
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.test_java_client import java, record_crc  # noqa: F401  (java: the fixture)

pytestmark = pytest.mark.timeout(400)

KEYS = 1000
UPDATES = 100_000


def create_topic(bootstrap, topic, configs, partitions=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1, config=configs)],
                        operation_timeout=15, request_timeout=15)[topic].result(timeout=20)


def produce_updates(bootstrap, topic, n=UPDATES, keys=KEYS, tombstone_every=97, producer=None):
    """n updates round-robin-ish over ``keys`` keys; every ``tombstone_every``-th update of
    the last tenth is a tombstone. Returns [(offset, key, value)] from the delivery reports."""
    acked = []
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.offset(), msg.key(), msg.value()))

    own = producer is None
    if own:
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "message.timeout.ms": 60000})
    rng = random.Random(12)
    for i in range(n):
        key = b"key-%04d" % rng.randrange(keys)
        value = None if i > n * 9 // 10 and i % tombstone_every == 0 else b"value-%07d-%s" % (i, key)
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    acked.sort()
    return acked


def latest_per_key(acked):
    """key -> (offset, value) of its newest record (value None: a tombstone)."""
    out = {}
    for off, k, v in acked:
        out[k] = (off, v)
    return out


def read_all(bootstrap, topic, consumer=None, until=None, timeout=60.0, start=0):
    """[(offset, key, value)] from ``start`` to the high watermark (or ``until`` records)."""
    own = consumer is None
    if own:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic, 0, start)])
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and len(got) >= until:
                break
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if until is None and (not got or msg.offset() >= high):
                        break
                    continue
                raise AssertionError(msg.error())
            got.append((msg.offset(), msg.key(), msg.value()))
        else:
            raise AssertionError(f"read of {topic} did not finish: {len(got)} records, high {high}")
        return got
    finally:
        if own:
            consumer.close()


def log_segments(data_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in (data_dir / "topics" / topic / "0").iterdir())


def wait_for(pred, timeout, what, broker=None, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}\n{broker.log_text() if broker else ''}")


def cleanings(broker, topic) -> int:
    return len(re.findall(rf"cleaned {re.escape(topic)}-0 ", broker.log_path.read_text(errors="replace")))


FAST_CLEANER = {"CANOPY_LOG_CLEANER_BACKOFF_MS": "300", "CANOPY_RETENTION_CHECK_INTERVAL_MS": "300"}


def test_compacted_topic_keeps_latest_per_key_with_original_offsets(broker_factory):
    broker = broker_factory(env=FAST_CLEANER)
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    # min.compaction.lag.ms holds the cleaner back until the early reader is in place;
    # max.compaction.lag.ms rolls the active segment so every record gets cleaned.
    create_topic(broker.bootstrap, topic, {
        "cleanup.policy": "compact", "segment.bytes": str(256 << 10),
        "min.compaction.lag.ms": "10000", "max.compaction.lag.ms": "12000",
        "delete.retention.ms": "12000", "min.cleanable.dirty.ratio": "0.1"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 60000})
    acked = produce_updates(broker.bootstrap, topic, producer=producer)
    assert len(acked) == UPDATES
    latest = latest_per_key(acked)
    live = {k: ov for k, ov in latest.items() if ov[1] is not None}
    tombstoned = {k for k, (_, v) in latest.items() if v is None}
    assert len(tombstoned) > 10 and len(live) > 800

    # A consumer that starts before the cleaning reads the first 30 000 records now...
    early = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"e-{uuid.uuid4().hex}",
                      "enable.auto.commit": False, "enable.partition.eof": True,
                      # a small prefetch: the rest of the log is fetched after the cleaning
                      "fetch.max.bytes": 65536, "message.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
                      "queued.max.messages.kbytes": 64, "queued.min.messages": 100})
    early.assign([TopicPartition(topic, 0, 0)])
    early_seen = read_all(broker.bootstrap, topic, consumer=early, until=30_000)
    assert cleanings(broker, topic) == 0, "cleaned before the early reader started (machine too slow?)"

    # ... and the rest after the cleaning has rewritten the log underneath it.
    wait_for(lambda: cleanings(broker, topic) >= 1, 60, "a cleaning", broker)
    wait_for(lambda: not any(o < UPDATES - 1 and o not in {lo for lo, _ in latest.values()}
                             for o, _, _ in read_all(broker.bootstrap, topic)),
             60, "every superseded record to be cleaned", broker, interval=1.0)
    early_seen += read_all(broker.bootstrap, topic, consumer=early)
    early.close()
    offsets = [o for o, _, _ in early_seen]
    assert offsets == sorted(set(offsets)), "offsets went backwards or repeated"
    assert latest_per_key(early_seen) == latest, "the early consumer missed a latest value"

    # A full read: exactly the latest record per key (tombstones still there) at its offset.
    full = read_all(broker.bootstrap, topic)
    assert sorted(full) == sorted((o, k, v) for k, (o, v) in latest.items())
    assert len(log_segments(broker.data_dir, topic)) < 20

    # The idempotent producer is not fenced by the cleaning: it goes on where it was.
    more = produce_updates(broker.bootstrap, topic, n=100, producer=producer, tombstone_every=10**9)
    assert more[0][0] > acked[-1][0]

    # After delete.retention.ms the tombstones go (the cleaner runs for them).
    def tombstones_gone():
        recs = read_all(broker.bootstrap, topic)
        return recs if not any(v is None for _, _, v in recs) else None
    full = wait_for(tombstones_gone, 90, "tombstones to be removed", broker, interval=1.0)
    want = latest_per_key(acked + more)
    assert latest_per_key(full) == {k: ov for k, ov in want.items() if ov[1] is not None}
    assert not tombstoned & {k for _, k, _ in full if k not in {m[1] for m in more}}

    # A restart reads the compacted log back as it was.
    broker.stop()
    broker = broker_factory(port=broker.port, env=FAST_CLEANER)
    assert latest_per_key(read_all(broker.bootstrap, topic)) == latest_per_key(full)


def test_keyless_record_refused_on_compacted_topic(broker):
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, {"cleanup.policy": "compact,delete"})
    errors = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "retries": 0})
    p.produce(topic, value=b"no key", on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0    # (a batch with one keyless record is refused whole, as in Kafka)
    p.produce(topic, key=b"k", value=b"keyed", on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors
    assert errors[1] is None
    assert [(k, v) for _, k, v in read_all(broker.bootstrap, topic)] == [(b"k", b"keyed")]
    # a bad policy is refused as Kafka refuses it
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    fut = admin.create_topics([NewTopic("bad-policy", 1, 1, config={"cleanup.policy": "shred"})])["bad-policy"]
    with pytest.raises(Exception) as e:
        fut.result(timeout=20)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_kill9_during_cleaning_loses_and_corrupts_nothing(broker_factory):
    """The cleaner is throttled so each cleaning takes seconds; the broker is SIGKILLed at a
    random moment of it, COMPACTION_KILL_LOOPS times, and restarted on the same directory."""
    loops = int(os.environ.get("COMPACTION_KILL_LOOPS", "4"))
    env = {**FAST_CLEANER, "CANOPY_LOG_CLEANER_IO_MAX_BYTES_PER_SECOND": str(1 << 20)}
    broker = broker_factory("kill", env=env)
    port = broker.port
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, {"cleanup.policy": "compact", "segment.bytes": str(128 << 10),
                                           "min.cleanable.dirty.ratio": "0.01"})
    acked = produce_updates(broker.bootstrap, topic, n=60_000, keys=2000)
    latest = latest_per_key(acked)
    rng = random.Random(7)
    interrupted = 0
    for _ in range(loops):
        # each round adds updates, so there is always something dirty to clean
        acked += produce_updates(broker.bootstrap, topic, n=5000, keys=2000, tombstone_every=10**9)
        time.sleep(rng.uniform(0.3, 2.5))
        broker.kill9()
        leftovers = [n for n in log_segments(broker.data_dir, topic) if n.endswith((".cleaned", ".swap"))]
        interrupted += bool(leftovers)
        broker = broker_factory("kill", port=port, env=env)
        # after recovery (which finished or dropped the half-done swap; the new process
        # may already be cleaning again) every latest value is there at its offset
        latest = latest_per_key(acked)
        got = latest_per_key(read_all(broker.bootstrap, topic))
        assert got == latest
    assert interrupted >= 1, "no kill landed inside a cleaning"
    # let the cleaner finish: a clean log with exactly the latest records
    broker.stop()
    done = cleanings(broker, topic)
    broker = broker_factory("kill", port=port, env=FAST_CLEANER)
    acked += produce_updates(broker.bootstrap, topic, n=5000, keys=2000, tombstone_every=10**9)
    latest = latest_per_key(acked)
    wait_for(lambda: cleanings(broker, topic) > done, 120, "a whole cleaning", broker)
    assert latest_per_key(read_all(broker.bootstrap, topic)) == latest


def test_consumer_offsets_stay_bounded(broker_factory):
    """A group committing every 100 ms for COMPACTION_OFFSETS_SECONDS (default 25): the
    offsets log's end offset keeps growing, its size on disk does not."""
    seconds = float(os.environ.get("COMPACTION_OFFSETS_SECONDS", "25"))
    seg = 16 << 10
    broker = broker_factory(env={**FAST_CLEANER, "CANOPY_OFFSETS_TOPIC_SEGMENT_BYTES": str(seg)})
    topic = f"work-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, {}, partitions=8)
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    offsets_dir = broker.data_dir / "topics" / "__consumer_offsets" / "0"
    try:
        sizes = []
        i = 0
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            i += 1
            c.commit(offsets=[TopicPartition(topic, p, i) for p in range(8)], asynchronous=False)
            sizes.append(sum(f.stat().st_size for f in offsets_dir.iterdir() if f.suffix == ".log"))
            time.sleep(0.1)
        committed = c.committed([TopicPartition(topic, p) for p in range(8)], timeout=10)
        assert [tp.offset for tp in committed] == [i] * 8
    finally:
        c.close()
    written = i * 8
    # ~80 records of ~100 bytes per second: without compaction the log would be far past
    # the bound; the active segment (<= segment.bytes) plus the cleaned live keys is all.
    assert written > 1000
    assert max(sizes[len(sizes) // 2:]) < 4 * seg, (sizes[-20:], broker.log_text())
    assert cleanings(broker, "__consumer_offsets") >= 2
    broker.stop()
    broker = broker_factory(port=broker.port, env=FAST_CLEANER)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(8)], timeout=15)
        assert [tp.offset for tp in committed] == [i] * 8
    finally:
        c.close()


def test_java_client_reads_cleaned_batches(broker_factory, java):
    """kafka-clients (Spark's client) reads what the cleaner wrote: recompressed batches,
    tombstone batches stamped with a delete horizon (firstTimestamp moved, every record's
    timestamp unchanged), gaps crossed by Spark's KafkaDataConsumer logic with
    failOnDataLoss=true."""
    broker = broker_factory(env=FAST_CLEANER)
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, {"cleanup.policy": "compact", "segment.bytes": str(8 << 10),
                                           "min.cleanable.dirty.ratio": "0.01"})
    t0 = 1_767_225_600_000
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "compression.type": "gzip", "batch.num.messages": 50})
    sent = []
    for i in range(6000):
        k = b"k%03d" % (i * 7 % 150)
        v = None if i % 53 == 0 else b"v%05d" % i
        p.produce(topic, key=k, value=v, timestamp=t0 + i * 10,
                  on_delivery=lambda err, msg: sent.append((msg.offset(), msg.key(), msg.value())))
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0 and len(sent) == 6000
    ts_of = {o: t0 + i * 10 for i, (o, _, _) in enumerate(sorted(sent))}
    wait_for(lambda: cleanings(broker, topic) >= 1, 60, "a cleaning", broker)
    # settle: no new cleaning for 3 s
    seen, since = cleanings(broker, topic), time.monotonic()
    while time.monotonic() - since < 3:
        time.sleep(0.3)
        if cleanings(broker, topic) != seen:
            seen, since = cleanings(broker, topic), time.monotonic()
    oracle = read_all(broker.bootstrap, topic)
    # cleaned (gaps from offset 0 on), tombstones kept (delete.retention.ms is a day)
    assert oracle[0][0] > 0 and len(oracle) < 6000 // 2 and any(v is None for _, _, v in oracle)
    end = max(o for o, _, _ in sent) + 1
    # kafka-clients as Spark's executors drive it: every kept record, in order, gaps skipped
    res = java.run("spark-get", broker.bootstrap, topic, 0, 0, end, "--fail-on-data-loss", "true",
                   broker=broker)
    kv = res.kv_lines()[-1]
    assert int(kv["count"]) == len(oracle) and int(kv["last"]) == oracle[-1][0]
    assert kv["crc"] == record_crc(oracle)
    # ListOffsets by timestamp (kafka-clients' Admin, as Spark's driver) finds the first kept
    # record at or after each time
    kept_ts = sorted((ts_of[o], o) for o, _, _ in oracle)
    probes = [t0 + 10 * i for i in (0, 777, 3001, 5990)]
    res = java.run("list-offsets", broker.bootstrap, topic, ",".join(map(str, probes)), broker=broker)
    got = [int(l.split("=")[1]) for l in res.lines() if l.startswith("0=")]
    assert got == [next((o for t, o in kept_ts if t >= pr), -1) for pr in probes]
    # librdkafka decodes every kept record's timestamp unchanged (delete-horizon batches too)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"ts-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    stamps = {}
    deadline = time.monotonic() + 60
    while len(stamps) < len(oracle) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            stamps[m.offset()] = m.timestamp()[1]
    c.close()
    assert stamps == {o: ts_of[o] for o, _, _ in oracle}
