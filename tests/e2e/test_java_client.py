"""The Java client, driven the way Spark's Kafka source and sink drive it, against canopy.

tests/java/SparkLikeClient.java is compiled once per kafka-clients version per session and
run as a subprocess per step: the driver's Admin calls (describeTopics, listOffsets
earliest/latest/forTimestamp), the executors' assign → seek → poll consumers, and the
sink's default idempotent acks=all producer. Two client versions: 3.9.1 (what Spark 4.0
ships) and 4.3.0 (a current client, newer request versions). Jars come from `make jars`
(tests/tools/fetch_jars.py) in .cache/jars, or $CANOPY_JARS.
"""
from __future__ import annotations

import os
import struct
import subprocess
import time
import urllib.request
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ROOT, BrokerProcess, free_port, require_tool

JARS = Path(os.environ.get("CANOPY_JARS", ROOT / ".cache" / "jars"))
SOURCE = ROOT / "tests" / "java" / "SparkLikeClient.java"
KAFKA_VERSIONS = ["3.9.1", "4.3.0"]


def compile_java(source: Path, version: str, tmp_path_factory) -> tuple[Path, str]:
    """Compile one of tests/java/*.java against a kafka-clients version (jars from `make
    jars`); returns (classes directory, classpath to run it with)."""
    require_tool("java", "runs the Java Kafka client")
    javac = require_tool("javac", f"compiles tests/java/{source.name}")
    jar_dir = JARS / f"kafka-{version}"
    require_tool(jar_dir / "VERSION", f"kafka-clients {version} jars from `make jars`")
    classes = tmp_path_factory.mktemp(f"{source.stem}-{version}")
    jars_cp = str(jar_dir / "*")
    p = subprocess.run([javac, "-d", str(classes), "-cp", jars_cp, str(source)],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.fail(f"javac of {source.name} against kafka-clients {version} failed:\n{p.stdout}{p.stderr}")
    return classes, f"{classes}{os.pathsep}{jars_cp}"

N = 5000
TS_STEP = 10  # ms between the CreateTimes of consecutive records
JAVA_TIMEOUT = 120  # s per subprocess; the client's own api timeouts are 60 s


@dataclass
class Result:
    stdout: str
    stderr: str
    returncode: int

    def lines(self) -> list[str]:
        return [l for l in self.stdout.splitlines() if l.strip()]

    def kv_lines(self) -> list[dict[str, str]]:
        return [dict(tok.split("=", 1) for tok in l.split() if "=" in tok) for l in self.lines()
                if not l.startswith("R ")]


class JavaClient:
    def __init__(self, version: str, classes: Path, classpath: str):
        self.version = version
        self.classes = classes
        self.classpath = classpath

    def run(self, *args: str, check: bool = True, broker=None) -> Result:
        cmd = ["java", "-cp", self.classpath, "SparkLikeClient", *map(str, args)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=JAVA_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"kafka-clients {self.version}: {' '.join(args)} hung > {JAVA_TIMEOUT}s\n"
                        f"stderr:\n{_tail(e.stderr)}{_broker_log(broker)}")
        res = Result(p.stdout, p.stderr, p.returncode)
        if check and p.returncode != 0:
            pytest.fail(f"kafka-clients {self.version}: {' '.join(args)} exited {p.returncode}\n"
                        f"stdout:\n{_tail(p.stdout)}\nstderr:\n{_tail(_no_slf4j(p.stderr))}"
                        f"{_broker_log(broker)}")
        return res


def _tail(s, n: int = 4000) -> str:
    if isinstance(s, bytes):
        s = s.decode(errors="replace")
    return (s or "")[-n:]


def _no_slf4j(s: str) -> str:
    return "\n".join(l for l in s.splitlines() if not l.startswith("SLF4J"))


def _broker_log(broker) -> str:
    return f"\nbroker log tail:\n{broker.log_text()[-3000:]}" if broker is not None else ""


@pytest.fixture(scope="session", params=KAFKA_VERSIONS, ids=lambda v: f"kafka-clients-{v}")
def java(request, tmp_path_factory) -> JavaClient:
    """SparkLikeClient compiled against one kafka-clients version, once per session."""
    version = request.param
    classes, classpath = compile_java(SOURCE, version, tmp_path_factory)
    return JavaClient(version, classes, classpath)


# ---------------------------------------------------------------- expected data

def key(i: int) -> bytes:
    return f"key-{i}".encode()


def value(i: int, size: int = 100) -> bytes:
    head = f"value-{i}-".encode()
    return head + b"." * max(0, size - len(head))


def record_crc(records) -> str:
    """Same CRC32 SparkLikeClient prints: offset, len+key, len+value per record."""
    crc = 0
    for off, k, v in records:
        crc = zlib.crc32(struct.pack(">q", off), crc)
        for b in (k, v):
            crc = zlib.crc32(struct.pack(">i", -1 if b is None else len(b)), crc)
            if b is not None:
                crc = zlib.crc32(b, crc)
    return f"{crc:08x}"


def parse_records(res: Result) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    out = []
    for l in res.lines():
        if l.startswith("R "):
            _, off, ts, k, v, nh = l.split()
            unhex = lambda h: None if h == "-" else (b"" if h == '""' else bytes.fromhex(h))
            out.append((int(off), int(ts), unhex(k), unhex(v), int(nh)))
    return out


def offsets_of(res: Result) -> dict[int, int]:
    """`<partition>=<offset>` lines from list-offsets."""
    out = {}
    for l in res.lines():
        p, o = l.split("=")
        out[int(p)] = int(o)
    return out


def offsets_by_spec(res: Result) -> dict[str, dict[int, int]]:
    """list-offsets with comma-separated specs: `spec=<s>` then `<partition>=<offset>` lines."""
    out: dict[str, dict[int, int]] = {}
    cur: dict[int, int] = {}
    for l in res.lines():
        if l.startswith("spec="):
            cur = out.setdefault(l[5:], {})
        else:
            p, o = l.split("=")
            cur[int(p)] = int(o)
    return out


def new_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Produced:
    topic: str
    ts_base: int


def produce_n(java, broker) -> Produced:
    """N records into partition 0 of an auto-created topic, by the Java producer with
    Spark's sink config (idempotent, acks=all), CreateTime = ts_base + i * TS_STEP."""
    topic = new_topic("spark")
    # Recent timestamps: time-based retention must not see them as expired.
    ts_base = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    res = java.run("produce", broker.bootstrap, topic, N, "--partition", 0,
                   "--ts-base", ts_base, "--ts-step", TS_STEP, broker=broker)
    kv = res.kv_lines()
    assert kv[0] == {"acked": str(N)}, res.stdout
    assert kv[1:] == [{"partition": "0", "min": "0", "max": str(N - 1), "count": str(N)}], res.stdout
    return Produced(topic, ts_base)


@pytest.fixture(scope="session")
def shared(java, tmp_path_factory):
    """One broker per client version holding produce_n's topic, for the tests that only
    read it (a JVM per step costs ~1 s; producing again for each of them would triple the
    run time). Tests that write use the per-test `broker` fixture."""
    b = BrokerProcess(tmp_path_factory.mktemp(f"shared-{java.version}") / "data").start()
    try:
        yield b, produce_n(java, b)
    finally:
        b.stop()


@pytest.fixture
def broker_ro(shared):
    return shared[0]


@pytest.fixture
def produced(shared) -> Produced:
    return shared[1]


# ---------------------------------------------------------------- the sink

def test_java_producer_sink(java, broker):
    # KafkaWriteTask with default producer config: InitProducerId, then idempotent
    # acks=all Produce; every record acknowledged, offsets 0..N-1 in send order.
    produce_n(java, broker)


# ---------------------------------------------------------------- the driver's view (Admin)

def test_admin_describe_topics(java, broker_ro, produced):
    res = java.run("admin-describe", broker_ro.bootstrap, produced.topic, broker=broker_ro)
    kv = res.kv_lines()
    assert kv[0]["topic"] == produced.topic
    n_parts = int(kv[0]["partitions"])
    assert n_parts >= 1 and len(kv) == 1 + n_parts, res.stdout
    assert [d["partition"] for d in kv[1:]] == [str(p) for p in range(n_parts)]
    for d in kv[1:]:
        assert d["leader"] == "0", res.stdout  # the fixture runs --node-id 0
        assert "0" in d["replicas"].split(",") and "0" in d["isr"].split(","), res.stdout


def test_list_offsets_earliest_latest(java, broker_ro, produced):
    got = offsets_by_spec(java.run("list-offsets", broker_ro.bootstrap, produced.topic,
                                   "earliest,latest", broker=broker_ro))
    earliest, latest = got["earliest"], got["latest"]
    assert earliest[0] == 0 and latest[0] == N
    # Every other auto-created partition is empty: earliest == latest == 0.
    assert set(earliest) == set(latest)
    assert all(earliest[p] == 0 and latest[p] == 0 for p in earliest if p != 0)


def test_list_offsets_read_committed_latest(java, broker_ro, produced):
    # ListOffsetsOptions(READ_COMMITTED) (kafka.isolation.level=read_committed): with no
    # transactions the last stable offset is the high watermark.
    latest = offsets_of(java.run("list-offsets", broker_ro.bootstrap, produced.topic, "latest",
                                 "--read-committed", broker=broker_ro))
    assert latest[0] == N


@pytest.mark.parametrize("what,ts_of,expected", [pytest.param(*case, id=case[0].replace(" ", "-")) for case in [
    ("between records 100 and 101", lambda b: b + 100 * TS_STEP + TS_STEP // 2, 101),
    ("exactly record 250's timestamp", lambda b: b + 250 * TS_STEP, 250),
    ("before the first record", lambda b: b - 60_000, 0),
    ("last record's timestamp", lambda b: b + (N - 1) * TS_STEP, N - 1),
    ("after the last record", lambda b: b + (N - 1) * TS_STEP + 1, -1),
    ("far in the future", lambda b: b + 10 * 365 * 86_400_000, -1),
]])
def test_list_offsets_for_timestamp(java, broker_ro, produced, what, ts_of, expected):
    # fetchSpecificTimestampBasedOffsets: first offset whose timestamp >= ts; -1 (no error)
    # when there is none — Spark's startingOffsetsByTimestampStrategy relies on it.
    ts = ts_of(produced.ts_base)
    res = java.run("list-offsets", broker_ro.bootstrap, produced.topic, ts, broker=broker_ro)
    got = offsets_of(res)
    assert got[0] == expected, f"forTimestamp({ts}) {what}: {_no_slf4j(res.stderr)}"


# ---------------------------------------------------------------- the executors' view

def test_consume_range_exact(java, broker_ro, produced):
    lo, hi = 100, 4000
    res = java.run("consume-range", broker_ro.bootstrap, produced.topic, 0, lo, hi, "--print",
                   broker=broker_ro)
    recs = parse_records(res)
    assert [r[0] for r in recs] == list(range(lo, hi))
    for off, ts, k, v, nh in recs:
        assert (k, v) == (key(off), value(off)), off
        assert ts == produced.ts_base + off * TS_STEP, off
        assert nh == 0
    summary = res.kv_lines()[-1]
    assert summary == {"count": str(hi - lo), "first": str(lo), "last": str(hi - 1),
                       "crc": record_crc((i, key(i), value(i)) for i in range(lo, hi))}


def test_consume_range_tail_and_single(java, broker_ro, produced):
    # A task whose range ends at the high watermark, and a one-record task.
    for lo, hi in [(N - 7, N), (4321, 4322), (0, 1)]:
        res = java.run("consume-range", broker_ro.bootstrap, produced.topic, 0, lo, hi, broker=broker_ro)
        assert res.kv_lines()[-1] == {
            "count": str(hi - lo), "first": str(lo), "last": str(hi - 1),
            "crc": record_crc((i, key(i), value(i)) for i in range(lo, hi))}, (lo, hi)


def test_consumer_available_offset_range(java, broker_ro, produced):
    # InternalKafkaConsumer.getAvailableOffsetRange: seekToBeginning/seekToEnd + position.
    res = java.run("offset-range", broker_ro.bootstrap, produced.topic, 0, broker=broker_ro)
    assert res.kv_lines()[-1] == {"earliest": "0", "latest": str(N)}


def test_consume_past_high_watermark_is_out_of_range(java, broker_ro, produced):
    # auto.offset.reset=none: Fetch must answer OFFSET_OUT_OF_RANGE (1) for an offset past
    # the high watermark, which the consumer raises as OffsetOutOfRangeException — Spark's
    # InternalKafkaConsumer.fetch catches it and reports data loss (failOnDataLoss).
    res = java.run("consume-range", broker_ro.bootstrap, produced.topic, 0, N + 5, N + 10,
                   "--timeout-ms", 20000, check=False, broker=broker_ro)
    assert res.returncode == 1, (res.returncode, res.stdout, _no_slf4j(res.stderr)[-2000:])
    assert "ERROR org.apache.kafka.clients.consumer.OffsetOutOfRangeException" in res.stderr


# ---------------------------------------------------------------- more partitions, keyed sink

def test_keyed_producer_across_partitions(java, broker):
    # Spark's sink without a partition column: the default partitioner hashes the key
    # (murmur2) over the partitions the producer learned from Metadata.
    topic, n, parts = new_topic("spark-keyed"), 3000, 3
    java.run("create-topic", broker.bootstrap, topic, parts, broker=broker)
    res = java.run("produce", broker.bootstrap, topic, n, "--headers", broker=broker)
    kv = res.kv_lines()
    assert kv[0] == {"acked": str(n)}
    counts = {int(d["partition"]): int(d["count"]) for d in kv[1:]}
    assert sum(counts.values()) == n and len(counts) == parts, res.stdout
    for d in kv[1:]:
        assert d["min"] == "0" and int(d["max"]) == int(d["count"]) - 1, res.stdout
    latest = offsets_of(java.run("list-offsets", broker.bootstrap, topic, "latest", broker=broker))
    assert latest == counts
    seen = 0
    for p, count in counts.items():
        recs = parse_records(java.run("consume-range", broker.bootstrap, topic, p, 0, count,
                                      "--print", broker=broker))
        assert [r[0] for r in recs] == list(range(count))
        for _, _, k, v, nh in recs:
            i = int(k.decode().split("-")[1])
            assert v == value(i) and nh == 1
        seen += len(recs)
    assert seen == n


def test_producer_clock_timestamps(java, broker):
    # Spark's sink leaves the timestamp null: the producer stamps CreateTime itself, many
    # records share a millisecond. forTimestamp must still return the FIRST offset whose
    # timestamp >= ts, even inside a batch.
    topic, n = new_topic("spark-clock"), 2000
    java.run("produce", broker.bootstrap, topic, n, "--partition", 0, broker=broker)
    recs = parse_records(java.run("consume-range", broker.bootstrap, topic, 0, 0, n, "--print",
                                  broker=broker))
    assert [r[0] for r in recs] == list(range(n))
    stamps = [r[1] for r in recs]
    probes = sorted({stamps[0], stamps[n // 3], stamps[n // 2] + 1, stamps[-1], max(stamps) + 1})
    res = java.run("list-offsets", broker.bootstrap, topic,
                   ",".join(map(str, probes)) + ",max-timestamp", broker=broker)
    by_spec = offsets_by_spec(res)
    # OffsetSpec.maxTimestamp (ListOffsets -3, not used by Spark): the first record carrying
    # the largest timestamp, as Kafka's RecordBatch.offsetOfMaxTimestamp picks it.
    assert by_spec.pop("max-timestamp")[0] == stamps.index(max(stamps))
    got = {int(ts): offs[0] for ts, offs in by_spec.items()}
    expected = {ts: next((off for off, t in enumerate(stamps) if t >= ts), -1) for ts in probes}
    assert got == expected, _no_slf4j(res.stderr)
    assert got[max(stamps) + 1] == -1


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_sink_and_timestamp_lookup(java, broker, codec):
    # kafka.compression.type on Spark's sink. Batches are stored opaque, but forTimestamp
    # must find the exact record inside a compressed batch (the broker decompresses there).
    topic, n = new_topic(f"spark-{codec}"), 2000
    ts_base = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    res = java.run("produce", broker.bootstrap, topic, n, "--partition", 0, "--ts-base", ts_base,
                   "--ts-step", TS_STEP, "--prop", f"compression.type={codec}",
                   "--prop", "linger.ms=20", broker=broker)
    assert res.kv_lines()[0] == {"acked": str(n)}
    between, exact = ts_base + 1500 * TS_STEP + 1, ts_base + 1234 * TS_STEP
    got = offsets_by_spec(java.run("list-offsets", broker.bootstrap, topic,
                                   f"earliest,latest,{between},{exact}", broker=broker))
    assert {k: v[0] for k, v in got.items()} == {
        "earliest": 0, "latest": n, str(between): 1501, str(exact): 1234}
    lo, hi = 10, n - 10  # ranges that start and end inside batches
    res = java.run("consume-range", broker.bootstrap, topic, 0, lo, hi, broker=broker)
    assert res.kv_lines()[-1] == {
        "count": str(hi - lo), "first": str(lo), "last": str(hi - 1),
        "crc": record_crc((i, key(i), value(i)) for i in range(lo, hi))}


# ---------------------------------------------------------------- cross-client

def test_kafka_python_producer_java_consumer(java, broker):
    from kafka import KafkaProducer

    topic, n = new_topic("kp-to-java"), 2000
    ts_base = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                             linger_ms=5, request_timeout_ms=30_000)
    try:
        futures = [producer.send(topic, key=key(i), value=value(i, 50), partition=0,
                                 timestamp_ms=ts_base + i * TS_STEP) for i in range(n)]
        producer.flush(timeout=60)
        metas = [f.get(timeout=60) for f in futures]
    finally:
        producer.close(timeout=10)
    assert [m.offset for m in metas] == list(range(n))

    ts = ts_base + 1234 * TS_STEP - 1
    got = offsets_by_spec(java.run("list-offsets", broker.bootstrap, topic, f"latest,{ts}",
                                   broker=broker))
    assert got["latest"][0] == n and got[str(ts)][0] == 1234
    lo, hi = 17, n
    res = java.run("consume-range", broker.bootstrap, topic, 0, lo, hi, "--print", broker=broker)
    recs = parse_records(res)
    assert [(r[0], r[1], r[2], r[3]) for r in recs] == [
        (i, ts_base + i * TS_STEP, key(i), value(i, 50)) for i in range(lo, hi)]
    assert res.kv_lines()[-1]["crc"] == record_crc((i, key(i), value(i, 50)) for i in range(lo, hi))


def test_java_producer_kafka_python_consumer(java, broker_ro, produced):
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(produced.topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker_ro.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="none", group_id=None)
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=1000).values():
                got.extend(recs)
    finally:
        consumer.close()
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got] == [
        (i, key(i), value(i), produced.ts_base + i * TS_STEP) for i in range(N)]


def test_consumer_fetches_in_a_session_woken_by_new_records(java, broker_factory):
    """KIP-227 as Spark's executors use it: the Java consumer opens a fetch session (seen in
    the broker's /metrics while it waits), its incremental Fetches are woken by records
    produced meanwhile, and it gets every record exactly once, in order."""
    from kafka import KafkaProducer

    http = f"127.0.0.1:{free_port()}"
    broker = broker_factory(extra_args=["--http-listen", http])

    def sessions() -> float:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
            text = r.read().decode()
        return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "kafka_server_fetchsessioncache_numincrementalfetchsessions")

    topic, n = new_topic("session"), 400
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)

    def send(lo, hi):
        for i in range(lo, hi):
            producer.send(topic, key=key(i), value=value(i, 50), partition=0, timestamp_ms=1_700_000_000_000 + i)
        producer.flush(timeout=60)
    try:
        send(0, n // 2)
        consumer = subprocess.Popen(["java", "-cp", java.classpath, "SparkLikeClient", "consume-range",
                                     broker.bootstrap, topic, "0", "0", str(n)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while sessions() < 1:
                assert consumer.poll() is None and time.monotonic() < deadline, \
                    f"no fetch session opened\n{_broker_log(broker)}"
                time.sleep(0.2)
            send(n // 2, n)
            out, err = consumer.communicate(timeout=JAVA_TIMEOUT)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
    finally:
        producer.close(timeout=10)
    assert consumer.returncode == 0, f"{out}\n{_tail(_no_slf4j(err))}{_broker_log(broker)}"
    assert Result(out, err, 0).kv_lines()[-1] == {
        "count": str(n), "first": "0", "last": str(n - 1),
        "crc": record_crc((i, key(i), value(i, 50)) for i in range(n))}
