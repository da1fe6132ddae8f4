"""Crash loop: kill -9 at random moments while an idempotent acks=all producer runs.

Each round starts `canopy serve` on the same data directory (fresh port, so batches the
dead round's producer still holds cannot race the checks), verifies the whole log, commits
a consumer-group offset, produces for a random 0.2-1.2 s, and kills the broker with
SIGKILL. After every restart: every acknowledged record is present exactly once at the
offset it was acknowledged with, offsets are contiguous from 0, every batch's CRC32C
checks, and the last acknowledged group commit is returned by OffsetFetch.

`make test`: 3 rounds per flush mode; `make reliability`: 50 rounds per flush mode.
"""
from __future__ import annotations

import random
import threading
import time

import pytest
from confluent_kafka import Producer

from protocol.messages import ApiKey

from .conftest import BrokerProcess, free_port, scale
from .helpers import commit_offset, fetch_committed, read_partition, record_figures, wait_for_listener

ROUNDS = scale(3, 50)
PARTITIONS = 2
pytestmark = pytest.mark.timeout(60 + ROUNDS * 30)


class Acks:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}

    def __call__(self, err, msg):
        if err is None:
            with self.lock:
                assert msg.value() not in self.acked, f"acknowledged twice: {msg.value()!r}"
                self.acked[msg.value()] = (msg.partition(), msg.offset())


def _produce_until(producer: Producer, topic: str, prefix: str, stop: threading.Event, acks) -> None:
    i = 0
    while not stop.is_set():
        for _ in range(50):
            try:
                producer.produce(topic, value=b"%s-%d" % (prefix.encode(), i), partition=i % PARTITIONS,
                                 on_delivery=acks)
            except BufferError:
                break
            i += 1
        producer.poll(0)
        time.sleep(0.01)  # ~5000 records/s: the log stays small enough to re-read every round


def _verify(client, topic: str, acks: Acks) -> int:
    """Check the whole log against the acknowledged set; returns records checked."""
    where: dict[bytes, tuple[int, int]] = {}
    checked = 0
    for p in range(PARTITIONS):
        rb = read_partition(client, topic, p)  # CRCs + contiguous offsets checked inside
        for offset, value in rb.records:
            assert value not in where, f"{value!r} stored twice: {where[value]} and {(p, offset)}"
            where[value] = (p, offset)
        checked += len(rb.records)
    missing = [v for v in acks.acked if v not in where]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
    moved = [(v, a, where[v]) for v, a in acks.acked.items() if where[v] != a]
    assert not moved, f"acknowledged records at other offsets: {moved[:3]}"
    return checked


@pytest.mark.parametrize("flush", ["async", "always"])
def test_crash_loop_keeps_every_acknowledged_record(tmp_path, flush):
    rng = random.Random(f"crash-loop-{flush}")
    data_dir = tmp_path / "data"
    topic, group = "crashloop", "crashloop-group"
    acks = Acks()
    committed = None  # (offset, metadata) of the last acknowledged group commit
    records_checked = 0
    brokers: list[BrokerProcess] = []
    try:
        for rnd in range(ROUNDS + 1):
            b = BrokerProcess(data_dir, port=free_port(), extra_args=["--flush", flush]).start()
            brokers.append(b)
            client = wait_for_listener(b.bootstrap)
            if rnd == 0:
                r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{
                    "name": topic, "num_partitions": PARTITIONS, "replication_factor": 1,
                    "configs": []}], "timeout_ms": 5000})
                assert r["topics"][0]["error_code"] == 0, r
            else:
                records_checked += _verify(client, topic, acks)
                if committed is not None:
                    assert fetch_committed(client, group, topic, 0) == (committed[0], committed[1]), \
                        f"round {rnd}: group commit {committed} lost"
            if rnd == ROUNDS:
                break
            target = len(acks.acked)
            assert commit_offset(client, group, topic, 0, target) == 0
            committed = (target, f"m{target}")
            client.close()

            producer = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True,
                                 "acks": "all", "linger.ms": rng.choice([0, 1, 5]),
                                 "message.timeout.ms": 4000, "socket.connection.setup.timeout.ms": 2000})
            stop = threading.Event()
            t = threading.Thread(target=_produce_until, args=(producer, topic, f"{flush}-{rnd}", stop, acks),
                                 daemon=True)
            t.start()
            # let the producer get going (connect, InitProducerId) before the random kill
            deadline = time.monotonic() + 10
            while not acks.acked and rnd == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.2, 1.2))
            b.kill9()
            stop.set()
            t.join(10)
            # Drop what is still queued or in flight (never acknowledged); delivery reports
            # of records acknowledged before the kill are still served by this flush.
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.flush(5)
            b.stop()
    finally:
        for b in brokers:
            b.stop()
    assert len(acks.acked) > ROUNDS * 100, f"only {len(acks.acked)} records acknowledged"
    record_figures(f"crash_loop[{flush}]", rounds=ROUNDS, kills=ROUNDS,
                   records_acknowledged=len(acks.acked), records_checked=records_checked,
                   records_lost=0, group_commits_checked=ROUNDS)
