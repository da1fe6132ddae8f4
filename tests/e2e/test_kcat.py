"""kcat (Debian's 1.7.1, librdkafka 2.0.2) against a real `canopy serve`.

Every kcat invocation runs as a subprocess with a timeout; the group test runs two
long-lived `kcat -G` consumers for a bounded time and then stops them.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from .conftest import require_tool

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def kcat():
    return require_tool("kcat", "kcat end-to-end tests")


def unique_topic(request, prefix="kcat") -> str:
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:60]
    return f"{prefix}-{name}-{uuid.uuid4().hex[:8]}"


def run_kcat(kcat, broker, args, *, input=None, timeout=60) -> subprocess.CompletedProcess:
    cmd = [kcat, "-b", broker.bootstrap, *args]
    try:
        proc = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{cmd} timed out after {timeout}s; stderr:\n"
                             f"{(e.stderr or b'').decode(errors='replace')[-3000:]}\n"
                             f"broker log:\n{broker.log_text()}") from None
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}; stderr:\n{proc.stderr.decode(errors='replace')[-3000:]}"
        f"\nbroker log:\n{broker.log_text()}")
    return proc


def create_topic(broker, topic, partitions):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}},
                            wait_for_metadata=True)
    finally:
        admin.close()


def produce_with_timestamps(broker, topic, timestamps):
    """Produce one record per timestamp to partition 0 (several records per batch)."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
    futures = [producer.send(topic, value=b"ts-%d" % i, partition=0, timestamp_ms=ts)
               for i, ts in enumerate(timestamps)]
    producer.flush(timeout=30)
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close(timeout=10)
    assert offsets == list(range(len(timestamps)))


def test_metadata_list(kcat, broker, request):
    topic = unique_topic(request)
    create_topic(broker, topic, 3)
    out = run_kcat(kcat, broker, ["-L", "-J", "-m", "15"]).stdout
    md = json.loads(out)
    assert md["brokers"] == [{"id": 0, "name": broker.bootstrap}]
    topics = {t["topic"]: t for t in md["topics"]}
    assert topic in topics, f"{topic} not in {list(topics)}"
    parts = sorted(topics[topic]["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for p in parts:
        assert p["leader"] == 0
        assert p["replicas"] == [{"id": 0}] and p["isrs"] == [{"id": 0}]
        assert "error" not in p
    # Plain text listing of a single topic.
    text = run_kcat(kcat, broker, ["-L", "-t", topic, "-m", "15"]).stdout.decode()
    assert f"broker 0 at {broker.bootstrap}" in text
    assert f'topic "{topic}" with 3 partitions' in text


def test_produce_and_consume_10000_keyed_with_headers(kcat, broker, request):
    topic = unique_topic(request)
    n = 10_000
    run_id = uuid.uuid4().hex[:12]
    lines = [f"key-{i:05d}:value-{i:05d}-{'x' * (i % 50)}" for i in range(n)]
    # Topic auto-created by kcat's Metadata request; everything goes to partition 0 so the
    # read-back order is the produce order.
    run_kcat(kcat, broker, ["-P", "-t", topic, "-p", "0", "-K:", "-H", "source=kcat",
                            "-H", f"run={run_id}"],
             input=("\n".join(lines) + "\n").encode(), timeout=90)
    out = run_kcat(kcat, broker, ["-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
                                  "-f", "%k|%s|%h|%o|%T\\n"], timeout=90).stdout.decode()
    rows = out.splitlines()
    assert len(rows) == n, f"read back {len(rows)} of {n}"
    now_ms = time.time() * 1000
    for i, row in enumerate(rows):
        key, value, headers, offset, ts = row.split("|")
        assert (key, value) == (f"key-{i:05d}", f"value-{i:05d}-{'x' * (i % 50)}"), row
        assert headers == f"source=kcat,run={run_id}", row
        assert int(offset) == i, row
        assert now_ms - 300_000 < int(ts) <= now_ms + 1000, row


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_produce_round_trip(kcat, broker, request, codec):
    # librdkafka writes raw (unframed) snappy; the others are standard frames.
    topic = unique_topic(request)
    n = 2000
    lines = [f"k{i}:{codec}-{i:05d}-" + "abc" * (i % 40) for i in range(n)]
    run_kcat(kcat, broker, ["-P", "-t", topic, "-p", "0", "-K:", "-z", codec,
                            "-X", "linger.ms=20"],
             input=("\n".join(lines) + "\n").encode(), timeout=60)
    out = run_kcat(kcat, broker, ["-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
                                  "-f", "%k:%s|%o\n"]).stdout.decode()
    rows = [r.rsplit("|", 1) for r in out.splitlines()]
    assert [kv for kv, _ in rows] == lines
    assert [int(o) for _, o in rows] == list(range(n))
    # Start in the middle of a compressed batch.
    out = run_kcat(kcat, broker, ["-C", "-t", topic, "-p", "0", "-o", "1234", "-c", "1",
                                  "-f", "%k:%s|%o\n"]).stdout.decode()
    assert out.splitlines() == [f"{lines[1234]}|1234"]


def test_consume_from_timestamp(kcat, broker, request):
    topic = unique_topic(request)
    create_topic(broker, topic, 1)
    base = int(time.time() * 1000) - 3_600_000
    timestamps = [base + 10 * i for i in range(200)]
    produce_with_timestamps(broker, topic, timestamps)

    def consume_from(ts):
        out = run_kcat(kcat, broker, ["-C", "-t", topic, "-p", "0", "-o", f"s@{ts}", "-e",
                                      "-f", "%o|%T|%s\\n"]).stdout.decode()
        return [tuple(r.split("|")) for r in out.splitlines()]

    # Between two records: starts at the first record after the timestamp (offset 56).
    rows = consume_from(base + 555)
    assert rows[0] == ("56", str(base + 560), "ts-56")
    assert [int(o) for o, _, _ in rows] == list(range(56, 200))
    # Exactly on a record.
    rows = consume_from(base + 1230)
    assert rows[0] == ("123", str(base + 1230), "ts-123")
    assert len(rows) == 200 - 123
    # Before everything: from the start.
    rows = consume_from(base - 10_000)
    assert rows[0] == ("0", str(base), "ts-0") and len(rows) == 200


def test_query_offsets_for_times(kcat, broker, request):
    topic = unique_topic(request)
    create_topic(broker, topic, 1)
    base = int(time.time() * 1000) - 3_600_000
    produce_with_timestamps(broker, topic, [base + 10 * i for i in range(200)])

    def query(ts):
        out = run_kcat(kcat, broker, ["-Q", "-t", f"{topic}:0:{ts}"]).stdout.decode()
        m = re.search(rf"^{re.escape(topic)} \[0\] offset (-?\d+)$", out, re.M)
        assert m, f"unexpected -Q output: {out!r}"
        return int(m.group(1))

    assert query(base + 555) == 56
    assert query(base + 560) == 56
    assert query(base) == 0
    assert query(base - 1) == 0
    assert query(base + 1990) == 199
    # After the newest record: no match, the broker answers offset -1 (librdkafka: END).
    assert query(base + 1991) == -1


class KcatGroupMember:
    """A `kcat -G` consumer whose stdout/stderr are collected line by line."""

    def __init__(self, kcat, broker, group, topic):
        self.proc = subprocess.Popen(
            [kcat, "-b", broker.bootstrap, "-G", group, "-u",
             "-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=10000",
             "-f", "%p|%o|%s\\n", topic],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.records: list[tuple[int, int, str]] = []
        self.stderr: list[str] = []
        self.assignments: list[set[int]] = []
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_out(self):
        for line in self.proc.stdout:
            p, o, s = line.decode().rstrip("\n").split("|", 2)
            self.records.append((int(p), int(o), s))

    def _read_err(self):
        for line in self.proc.stderr:
            text = line.decode(errors="replace").rstrip("\n")
            self.stderr.append(text)
            m = re.search(r"rebalanced \(memberid [^)]*\): assigned: (.*)$", text)
            if m:
                self.assignments.append(
                    {int(x) for x in re.findall(r"\[(\d+)\]", m.group(1))})
            elif "rebalanced" in text and "revoked" in text:
                self.assignments.append(set())

    @property
    def assigned(self) -> set[int]:
        return self.assignments[-1] if self.assignments else set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for t in self._threads:
            t.join(5)


def test_two_group_members_split_partitions(kcat, broker, request):
    topic = unique_topic(request)
    group = f"kcatg-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 4)
    members = [KcatGroupMember(kcat, broker, group, topic)]
    try:
        # Second member joins once the first one holds an assignment, forcing a rebalance.
        deadline = time.monotonic() + 30
        while not members[0].assigned and time.monotonic() < deadline:
            time.sleep(0.1)
        assert members[0].assigned == {0, 1, 2, 3}, members[0].stderr
        members.append(KcatGroupMember(kcat, broker, group, topic))
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            a, b = members[0].assigned, members[1].assigned
            if len(a) == 2 and len(b) == 2 and a | b == {0, 1, 2, 3}:
                break
            time.sleep(0.1)
        a, b = members[0].assigned, members[1].assigned
        assert len(a) == 2 and len(b) == 2 and a | b == {0, 1, 2, 3}, (
            f"group did not split 4 partitions between 2 members: {a} / {b}\n"
            f"{members[0].stderr}\n{members[1].stderr}")
        split = [a, b]
        rebalances = [len(m.assignments) for m in members]

        # Produce only now, so each message has exactly one owner.
        n = 2000
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        for i in range(n):
            producer.send(topic, value=b"g-%d" % i, partition=i % 4)
        producer.flush(timeout=30)
        producer.close(timeout=10)

        deadline = time.monotonic() + 60
        while sum(len(m.records) for m in members) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # anything extra (duplicates) would show up now
        # No further rebalance while the messages were being read.
        assert [len(m.assignments) for m in members] == rebalances, (
            f"unexpected rebalance:\n{members[0].stderr}\n{members[1].stderr}")
    finally:
        for m in members:
            m.stop()

    total = sum(len(m.records) for m in members)
    assert total == n, (f"members read {total} records for {n} produced\n"
                        f"{members[0].stderr}\n{members[1].stderr}\n{broker.log_text()}")
    values = sorted(s for m in members for _, _, s in m.records)
    assert values == sorted(f"g-{i}" for i in range(n))
    for m, mine in zip(members, split):
        # Each member read only its own partitions, in offset order, from offset 0.
        assert {p for p, _, _ in m.records} == mine
        for p in mine:
            assert [o for q, o, _ in m.records if q == p] == list(range(n // 4))
