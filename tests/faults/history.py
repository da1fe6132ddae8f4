"""The client side of a fault run: real clients, and the history they leave behind.

* ``ProducerWorkload``: an idempotent acks=all confluent-kafka producer sending unique
  values round-robin over the partitions; every delivery report is recorded, so the
  history knows each acknowledged value's (partition, offset).
* ``ConsumerWorkload``: a kafka-python group member that commits after every poll and
  records every offset it was handed and every commit that succeeded.
* ``check``: the checker, after the faults healed (see its doc).
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from protocol.records import BATCH_HEADER_SIZE, BatchHeader, iter_records
from tests.e2e.rawclient import RawClient


def _error_name(e: Exception) -> str:
    err = e.args[0] if e.args else None
    return err.name() if hasattr(err, "name") else type(e).__name__


class ProducerWorkload(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int = 400):
        super().__init__(daemon=True, name="fault-producer")
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.stop_event = threading.Event()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, str] = {}
        self.sent = 0
        self.fatal = 0        # producers replaced after a fatal (idempotence) error
        self.errors = Counter()
        self.lock = threading.Lock()

    def _new_producer(self):
        import confluent_kafka
        config = {
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 120000, "request.timeout.ms": 10000,
            "socket.timeout.ms": 10000, "metadata.max.age.ms": 2000,
            "topic.metadata.refresh.interval.ms": 1000, "retry.backoff.ms": 200, "log_level": 3,
        }
        if os.environ.get("CANOPY_FAULTS_RDKAFKA_DEBUG"):
            # For diagnosis: librdkafka's own account (e.g. "eos,msg" shows why it bumped
            # its producer epoch and renumbered messages).
            config.update(debug=os.environ["CANOPY_FAULTS_RDKAFKA_DEBUG"], log_level=7)
        return confluent_kafka.Producer(config)

    def _report(self, err, msg):
        value = msg.value()
        with self.lock:
            if err is None:
                self.acked[value] = (msg.partition(), msg.offset())
            else:
                self.failed[value] = err.str()
                self.errors[err.name()] += 1
                if err.fatal():
                    self._fatal = True

    def run(self) -> None:
        import confluent_kafka
        producer = self._new_producer()
        self._fatal = False
        seq = 0
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            value = b"v%09d" % seq
            try:
                producer.produce(self.topic, value=value, partition=seq % self.partitions, on_delivery=self._report)
                seq += 1
                self.sent = seq
            except BufferError:
                producer.poll(0.1)
                continue
            except confluent_kafka.KafkaException as e:
                self.errors[_error_name(e)] += 1
                self._fatal = True
            try:
                producer.poll(0)
            except confluent_kafka.KafkaException as e:   # a fatal error surfaces here too
                self.errors[_error_name(e)] += 1
                self._fatal = True
            if self._fatal:
                # librdkafka's idempotent producer stops for good after a fatal error (e.g.
                # OUT_OF_ORDER_SEQUENCE); the application's remedy is a new producer.
                try:
                    producer.flush(30)
                except confluent_kafka.KafkaException:
                    pass
                self.fatal += 1
                producer = self._new_producer()
                self._fatal = False
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
        try:
            self.unflushed = producer.flush(120)
        except confluent_kafka.KafkaException as e:
            self.errors[_error_name(e)] += 1

    def finish(self) -> None:
        self.stop_event.set()
        self.join(180)


class ConsumerWorkload(threading.Thread):
    """One group member; commits synchronously after each poll. A consumer's positions
    must go forward one offset at a time (no skips, never backwards), except that after
    a rebalance it resumes at the group's committed offset, which must equal its own last
    successful commit (committed offsets never regress)."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        super().__init__(daemon=True, name="fault-consumer")
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group
        self.stop_event = threading.Event()
        self.consumed = 0
        self.expected: dict[int, int] = {}           # partition -> next offset it should get
        self.last_commit: dict[int, int] = {}        # partition -> last committed offset
        self.backwards: list[tuple] = []
        self.skips: list[tuple] = []
        self.regressions: list[tuple] = []
        self.errors = Counter()

    def run(self) -> None:
        from kafka import KafkaConsumer, OffsetAndMetadata
        from kafka.structs import TopicPartition
        consumer = None
        while not self.stop_event.is_set():
            try:
                if consumer is None:
                    consumer = KafkaConsumer(
                        self.topic, group_id=self.group, bootstrap_servers=self.bootstrap,
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        session_timeout_ms=10000, heartbeat_interval_ms=1000, request_timeout_ms=15000,
                        max_poll_records=500, metadata_max_age_ms=2000)
                    self.expected.clear()   # a new member resumes at the committed offsets
                batches = consumer.poll(timeout_ms=500)
                commit = {}
                for tp, records in batches.items():
                    for r in records:
                        exp = self.expected.get(tp.partition)
                        if exp is None:
                            committed = self.last_commit.get(tp.partition)
                            if committed is not None and r.offset < committed:
                                self.backwards.append((tp.partition, committed, r.offset, "after rejoin"))
                        elif r.offset < exp:
                            self.backwards.append((tp.partition, exp, r.offset))
                        elif r.offset > exp:
                            self.skips.append((tp.partition, exp, r.offset))
                        self.expected[tp.partition] = r.offset + 1
                        self.consumed += 1
                    commit[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
                if commit:
                    consumer.commit(commit)
                    for tp, om in commit.items():
                        prev = self.last_commit.get(tp.partition, -1)
                        if om.offset < prev:
                            self.regressions.append((tp.partition, prev, om.offset))
                        self.last_commit[tp.partition] = max(prev, om.offset)
                # A rebalance drops assignments; positions restart from the committed offsets.
                assigned = {tp.partition for tp in consumer.assignment()}
                for part in list(self.expected):
                    if part not in assigned:
                        del self.expected[part]
            except Exception as e:   # commit failed (rebalance, coordinator moved): keep going
                self.errors[type(e).__name__] += 1
                time.sleep(0.2)
                for part in list(self.expected):
                    del self.expected[part]
        if consumer is not None:
            try:
                committed = {}
                for part in self.last_commit:
                    c = consumer.committed(TopicPartition(self.topic, part))
                    committed[part] = c
                for part, c in committed.items():
                    if c is not None and c < self.last_commit[part]:
                        self.regressions.append((part, self.last_commit[part], c, "final"))
            except Exception as e:
                self.errors[type(e).__name__] += 1
            consumer.close(autocommit=False)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)


def iter_all_records(data: bytes):
    """Every record of every batch in a Fetch response's records (iter_records decodes
    the one batch at a position)."""
    pos = 0
    while pos + BATCH_HEADER_SIZE <= len(data):
        size = BatchHeader.parse(data, pos).total_size
        if pos + size > len(data):
            return   # a partial batch at the end of a response
        yield from iter_records(data, pos)
        pos += size


def read_partition(bootstrap: str, topic: str, partition: int, timeout: float = 60) -> tuple[list, list, int]:
    """Everything a consumer can read from one broker (no redirects): ([(offset, value)],
    [raw batch bytes], high watermark)."""
    c = RawClient(bootstrap)
    c.sock.settimeout(15)
    out, batches = [], []
    offset = 0
    hw = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, f"reading {topic}-{partition} from {bootstrap} timed out"
            r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 8 << 20,
                                  "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                      {"partition": partition, "fetch_offset": offset, "current_leader_epoch": -1,
                                       "log_start_offset": -1, "partition_max_bytes": 4 << 20}]}],
                                  "forgotten_topics_data": [], "rack_id": ""})
            p = r["responses"][0]["partitions"][0]
            assert p["error_code"] == 0, p
            hw = p["high_watermark"]
            data = bytes(p["records"])
            if not data:
                return out, batches, hw
            pos = 0
            while pos + 12 <= len(data):
                size = int.from_bytes(data[pos + 8:pos + 12], "big") + 12
                batches.append(data[pos:pos + size])
                pos += size
            for rec in iter_all_records(data):
                if rec.offset >= offset:
                    out.append((rec.offset, rec.value))
            offset = max(offset, out[-1][0] + 1 if out else offset)
            if offset >= hw:
                return out, batches, hw
    finally:
        c.close()


@dataclass
class Verdict:
    acked: int = 0
    lost: list = field(default_factory=list)
    duplicated: list = field(default_factory=list)
    moved: list = field(default_factory=list)
    diverged: list = field(default_factory=list)
    backwards: list = field(default_factory=list)
    skips: list = field(default_factory=list)
    regressions: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.moved or self.diverged or self.backwards
                    or self.skips or self.regressions)


def check(cluster, topic: str, partitions: int, producer: ProducerWorkload,
          consumer: ConsumerWorkload | None) -> Verdict:
    """After the faults healed: every acknowledged record is read back exactly once, at
    its acknowledged offset; every replica of a partition holds the same bytes up to the
    partition's high watermark; the consumer never went backwards or skipped; committed
    offsets never regressed."""
    v = Verdict(acked=len(producer.acked))
    meta = cluster.metadata(topic)
    where: dict[bytes, list] = defaultdict(list)
    for part in range(partitions):
        leader, _, replicas, _ = meta[part]
        records, leader_batches, hw = read_partition(cluster.nodes[leader].bootstrap, topic, part)
        for off, value in records:
            where[value].append((part, off))
        # Replicas: byte-identical over the committed range (batches below the leader's HW).
        for r in replicas:
            if r == leader:
                continue
            try:
                _, batches, _ = read_partition(cluster.nodes[r].bootstrap, topic, part)
            except (AssertionError, OSError) as e:
                v.diverged.append((part, r, f"unreadable: {e}"))
                continue
            n = min(len(batches), len(leader_batches))
            if batches[:n] != leader_batches[:n]:
                first = next(i for i in range(n) if batches[i] != leader_batches[i])
                v.diverged.append((part, r, f"batch #{first} differs"))
    for value, at in producer.acked.items():
        seen = where.get(value, [])
        if not seen:
            v.lost.append((value, at))
        elif len(seen) > 1:
            v.duplicated.append((value, at, seen))
        elif seen[0] != at and at[1] is not None:
            # (librdkafka may acknowledge without an offset: messages "implicitly acked"
            # because a later batch of the same producer succeeded. Those must be read
            # back exactly once, but have no offset to compare.)
            v.moved.append((value, at, seen[0]))
    if consumer is not None:
        v.backwards, v.skips, v.regressions = consumer.backwards, consumer.skips, consumer.regressions
    return v
