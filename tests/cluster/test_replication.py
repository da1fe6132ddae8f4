"""Replication trees, proven on the compose.yaml cluster run as local processes, with
real clients: kcat, kafka-python, confluent-kafka and a raw protocol client.

Tree of a new topic's partition 0 (compose: 4 brokers, fanout 2; the controller is elected
through etcd and may lead partitions like any broker): e.g. 1 (leader) -> 2, 3 ; 2 -> 4.
"""
from __future__ import annotations

import hashlib
import select
import signal
import struct
import subprocess
import threading
import time

from kafka import KafkaProducer
from protocol.errors import ErrorCode
from protocol.framing import parse_response_header
from protocol.messages import ApiKey, api
from protocol.records import iter_records

from tests.e2e.conftest import require_tool
from tests.e2e.rawclient import RawClient, init_producer_id, make_batch, produce

from .conftest import wait_for

N_TREE = 50_000


def fetch_all(bootstrap: str, topic: str, until: int, partition: int = 0, timeout: float = 60) -> list:
    """A consumer that reads from exactly one broker (no metadata, no redirects)."""
    c = RawClient(bootstrap)
    out, offset = [], 0
    deadline = time.monotonic() + timeout
    try:
        while offset < until:
            assert time.monotonic() < deadline, f"only {offset} of {until} records from {bootstrap}"
            r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 8 << 20,
                                  "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                      {"partition": partition, "fetch_offset": offset,
                                       "partition_max_bytes": 4 << 20}]}]})
            p = r["responses"][0]["partitions"][0]
            assert p["error_code"] == 0, p
            if not p["records"]:
                # A follower answers below its high watermark, which can trail its log end
                # offset for a moment (the leader's next answer carries it): ask again.
                continue
            for rec in iter_records(bytes(p["records"])):
                if rec.offset >= offset:
                    out.append((rec.offset, rec.value))
                    offset = rec.offset + 1
    finally:
        c.close()
    return out


def segment_digests(cluster, topic: str) -> dict[int, str]:
    out = {}
    for node_id, node in cluster.nodes.items():
        d = node.env["CANOPY_DATA_DIR"]
        h = hashlib.sha256()
        from pathlib import Path
        for f in sorted(Path(d, "topics", topic, "0").glob("*.log")):
            h.update(f.read_bytes())
        out[node_id] = h.hexdigest()
    return out


def tree_of(cluster, topic):
    leader, epoch, replicas, isr = cluster.metadata(topic)[0]
    return leader, epoch, replicas, isr


def new_leader_of(cluster, topic, old: int) -> int | None:
    """The partition's leader once it is another live broker (-1 while none is elected)."""
    leader = tree_of(cluster, topic)[0]
    return leader if leader not in (old, -1) else None


def test_tree_metadata_replication_and_grandchild_reads(cluster):
    kcat = require_tool("kcat", "Debian package kcat")
    cluster.create_topic("tree", configs={"min.insync.replicas": "2"}, via=3)
    leader, _, replicas, _ = tree_of(cluster, "tree")
    assert leader == replicas[0] and len(replicas) == 4
    # Every broker reports the same leaders and replicas.
    views = set()
    for node in cluster.nodes.values():
        out = subprocess.run([kcat, "-b", node.bootstrap, "-L", "-t", "tree"], capture_output=True,
                             text=True, timeout=30).stdout
        views.add(tuple(line.split(", isrs")[0].strip() for line in out.splitlines() if "partition 0" in line))
    assert len(views) == 1, views

    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap(replicas[1]), acks="all", linger_ms=5)
    futures = [producer.send("tree", value=b"%d" % i) for i in range(N_TREE)]
    producer.flush(120)
    assert all(f.succeeded() for f in futures)
    assert [f.get().offset for f in futures] == list(range(N_TREE))
    producer.close()

    grandchild = replicas[3]
    records = fetch_all(cluster.nodes[grandchild].bootstrap, "tree", N_TREE)
    assert [v for _, v in records] == [b"%d" % i for i in range(N_TREE)]
    assert [o for o, _ in records] == list(range(N_TREE))

    wait_for(lambda: all(cluster.log_end_offset(n, "tree") == N_TREE for n in cluster.nodes), "replicas caught up")
    cluster.stop()   # closing trims the sparse active segments to their data
    digests = segment_digests(cluster, "tree")
    assert len(set(digests.values())) == 1, digests


def test_producer_bootstrapped_to_a_follower_is_forwarded(cluster):
    cluster.create_topic("fwd", configs={"min.insync.replicas": "2"})
    leader, _, replicas, _ = tree_of(cluster, "fwd")
    for i, follower in enumerate(replicas[1:]):   # a child, the other child, the grandchild
        c = RawClient(cluster.nodes[follower].bootstrap)
        r = produce(c, "fwd", make_batch([b"via-%d-%d" % (follower, j) for j in range(10)]), acks=-1)
        c.close()
        assert (r["error_code"], r["base_offset"]) == (0, 10 * i), r
    got = fetch_all(cluster.nodes[leader].bootstrap, "fwd", 30)
    assert [v for _, v in got][:10] == [b"via-%d-%d" % (replicas[1], j) for j in range(10)]
    # kcat bootstrapped to the grandchild only.
    kcat = require_tool("kcat", "Debian package kcat")
    subprocess.run([kcat, "-b", cluster.nodes[replicas[3]].bootstrap, "-P", "-t", "fwd"],
                   input=b"kcat-1\nkcat-2\n", check=True, timeout=30)
    assert [v for _, v in fetch_all(cluster.nodes[leader].bootstrap, "fwd", 32)][30:] == [b"kcat-1", b"kcat-2"]


def test_idempotent_batch_at_a_follower_is_refused_not_forwarded(cluster):
    """An idempotent producer's in-flight window must be judged against one log: a batch
    with a producer id that reaches a follower is answered NOT_LEADER_OR_FOLLOWER, as
    Kafka answers, and nothing is appended (forwarding half a window made librdkafka bump
    its epoch and renumber appended batches: issue 10's duplicates)."""
    cluster.create_topic("idem-fwd", configs={"min.insync.replicas": "2"})
    leader, _, replicas, _ = tree_of(cluster, "idem-fwd")
    c = RawClient(cluster.nodes[leader].bootstrap)
    pid, epoch = init_producer_id(c)
    c.close()
    c = RawClient(cluster.nodes[replicas[1]].bootstrap)
    r = produce(c, "idem-fwd", make_batch([b"idem-0"], producer_id=pid, producer_epoch=epoch,
                                          base_sequence=0), acks=-1)
    c.close()
    assert r["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER, r
    c = RawClient(cluster.nodes[leader].bootstrap)
    r = produce(c, "idem-fwd", make_batch([b"idem-0"], producer_id=pid, producer_epoch=epoch,
                                          base_sequence=0), acks=-1)
    c.close()
    assert (r["error_code"], r["base_offset"]) == (0, 0), r
    assert [v for _, v in fetch_all(cluster.nodes[leader].bootstrap, "idem-fwd", 1)] == [b"idem-0"]


def test_rack_aware_consumers_read_from_their_racks_follower(cluster):
    import confluent_kafka
    cluster.create_topic("racks")
    leader, _, replicas, _ = tree_of(cluster, "racks")
    follower = replicas[2]
    rack = cluster.nodes[follower].env["CANOPY_RACK"]
    p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap(), "acks": "all"})
    for i in range(500):
        p.produce("racks", value=b"r%d" % i)
    assert p.flush(30) == 0
    logs = []
    c = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap(leader), "group.id": "racks-test",
                                  "client.rack": rack, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "debug": "fetch",
                                  "logger": _Collect(logs)})
    c.assign([confluent_kafka.TopicPartition("racks", 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 500 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert got == [b"r%d" % i for i in range(500)]
    text = "\n".join(logs)
    # librdkafka reports the leader's preferred_read_replica and then fetches from it.
    assert "preferred replica" in text.lower() or f"broker {follower}" in text, text[-3000:]
    assert f"{follower}" in text


class _Collect:
    def __init__(self, sink: list):
        self.sink = sink

    def log(self, level, msg, *args):
        self.sink.append(msg % args if args else msg)

    # logging.Logger-like interface used by confluent-kafka
    debug = info = warning = error = critical = log

    def isEnabledFor(self, level):
        return True


def test_sigstopped_follower_leaves_isr_then_catches_up(cluster):
    cluster.create_topic("stop", configs={"min.insync.replicas": "2"})
    leader, _, replicas, isr = tree_of(cluster, "stop")
    child = replicas[1]
    wait_for(lambda: sorted(tree_of(cluster, "stop")[3]) == sorted(replicas[:3]), "full ISR")
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap(leader), acks="all", linger_ms=2)
    for i in range(1000):
        producer.send("stop", value=b"a%d" % i)
    producer.flush(60)
    node = cluster.nodes[child]
    node.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: child not in tree_of(cluster, "stop")[3], "stopped child out of the ISR",
                 timeout=cluster.lag_time_ms / 1000 + 20)
        futures = [producer.send("stop", value=b"b%d" % i) for i in range(1000)]
        producer.flush(60)
        assert all(f.succeeded() for f in futures)   # min.insync=2 still holds: leader + other child
    finally:
        node.signal(signal.SIGCONT)
    wait_for(lambda: cluster.log_end_offset(child, "stop") == 2000, "stopped child caught up", timeout=60)
    wait_for(lambda: child in tree_of(cluster, "stop")[3], "child back in the ISR", timeout=60)
    producer.close()
    values = [v for _, v in fetch_all(cluster.nodes[child].bootstrap, "stop", 2000)]
    assert values == [b"a%d" % i for i in range(1000)] + [b"b%d" % i for i in range(1000)]


def test_old_leader_truncates_uncommitted_tail_and_converges(cluster):
    cluster.create_topic("div", configs={"min.insync.replicas": "2"})
    leader, epoch, replicas, _ = tree_of(cluster, "div")
    wait_for(lambda: sorted(tree_of(cluster, "div")[3]) == sorted(replicas[:3]), "full ISR")
    c = RawClient(cluster.nodes[leader].bootstrap)
    for i in range(10):
        assert produce(c, "div", make_batch([b"c%d-%d" % (i, j) for j in range(10)]), acks=-1)["error_code"] == 0
    committed = 100
    children = replicas[1:3]
    for ch in children:
        cluster.nodes[ch].signal(signal.SIGSTOP)
    # acks=1 writes the children never see: the leader's uncommitted tail.
    for i in range(5):
        assert produce(c, "div", make_batch([b"lost%d" % i]), acks=1)["error_code"] == 0
    c.close()
    assert cluster.log_end_offset(leader, "div") == committed + 5
    cluster.nodes[leader].kill9()
    for ch in children:
        cluster.nodes[ch].signal(signal.SIGCONT)
    new_leader = wait_for(lambda: new_leader_of(cluster, "div", leader),
                          "a child promoted", timeout=cluster.failure_timeout_ms / 1000 + 30)
    assert new_leader in children
    assert tree_of(cluster, "div")[1] == epoch + 1
    # The new leader holds every committed record, and possibly some of the acks=1 tail
    # that reached it before the children were stopped; never more than that.
    kept = cluster.log_end_offset(new_leader, "div")
    assert committed <= kept < committed + 5
    cluster.nodes[leader].start()
    cluster.nodes[leader].wait_listening()
    wait_for(lambda: "truncating div-0 from 105" in cluster.nodes[leader].log_text(), "old leader truncated",
             timeout=60)
    p = RawClient(cluster.nodes[new_leader].bootstrap)
    assert produce(p, "div", make_batch([b"after"]), acks=-1)["error_code"] == 0
    p.close()
    wait_for(lambda: all(cluster.log_end_offset(n, "div") == kept + 1 for n in cluster.nodes), "converged",
             timeout=60)
    values = [v for _, v in fetch_all(cluster.nodes[leader].bootstrap, "div", kept + 1)]
    assert values[:committed] == [b"c%d-%d" % (i, j) for i in range(10) for j in range(10)]
    assert values[-1] == b"after" and b"lost4" not in values
    cluster.stop()
    assert len(set(segment_digests(cluster, "div").values())) == 1


def test_leader_kill9_during_acks_all_ten_rounds(cluster):
    import confluent_kafka
    cluster.create_topic("failover", configs={"min.insync.replicas": "2"})
    wait_for(lambda: len(tree_of(cluster, "failover")[3]) == 3, "full ISR")
    acked: dict[bytes, int] = {}
    errors: list = []
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked[msg.value()] = msg.offset()
        else:
            errors.append(err)

    def produce_loop():
        p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap(), "enable.idempotence": True,
                                      "acks": "all", "linger.ms": 5, "message.timeout.ms": 120000,
                                      "topic.metadata.refresh.interval.ms": 1000})
        i = 0
        while not stop.is_set():
            try:
                p.produce("failover", value=b"%08d" % i, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.001 if i % 100 else 0.02)
        p.flush(120)

    t = threading.Thread(target=produce_loop)
    t.start()
    failover_s = []
    try:
        for _ in range(10):
            time.sleep(1.0)
            leader = tree_of(cluster, "failover")[0]
            before = len(acked)
            cluster.nodes[leader].kill9()
            started = time.monotonic()
            new_leader = wait_for(
                lambda: new_leader_of(cluster, "failover", leader),
                "promotion", timeout=cluster.failure_timeout_ms / 1000 + 30)
            failover_s.append(time.monotonic() - started)
            assert new_leader != leader
            wait_for(lambda: len(acked) > before + 100, "producer carries on after failover", timeout=60)
            cluster.nodes[leader].start()
            cluster.nodes[leader].wait_listening()
    finally:
        stop.set()
        t.join(180)
    assert not errors, errors[:5]
    end = wait_for(lambda: cluster.log_end_offset(tree_of(cluster, "failover")[0], "failover"), "log end")
    records = fetch_all(cluster.nodes[tree_of(cluster, "failover")[0]].bootstrap, "failover", end, timeout=120)
    values = [v for _, v in records]
    assert len(values) == len(set(values)), "duplicates in the log"
    missing = set(acked) - set(values)
    assert not missing, f"{len(missing)} acknowledged records lost"
    for v, off in acked.items():
        assert records[off][1] == v
    print(f"failover rounds: 10, acknowledged {len(acked)}, failover seconds {[round(x, 1) for x in failover_s]}")


def test_produce_pipelined_past_an_acks_all_wait_answers_in_order(cluster):
    """Issue 15: while an acks=all Produce waits for its ISR, the connection goes on reading
    the next Produce requests and appends them (a producer's pipelined batches are not held
    back one replication round trip each); the answers still come in request order, and a
    request of another kind runs only once every earlier answer is written."""
    cluster.create_topic("pipe", configs={"min.insync.replicas": "2"})
    leader, _, replicas, _ = tree_of(cluster, "pipe")
    wait_for(lambda: sorted(tree_of(cluster, "pipe")[3]) == sorted(replicas[:3]), "full ISR")
    child = cluster.nodes[replicas[1]]
    client = RawClient(cluster.bootstrap(leader))
    child.signal(signal.SIGSTOP)   # the ISR cannot advance: the first produce must wait
    try:
        for acks, tag in ((-1, b"a"), (-1, b"b"), (1, b"c")):
            client.send_only(ApiKey.PRODUCE, 9, {"acks": acks, "timeout_ms": 60_000, "topic_data": [
                {"name": "pipe", "partition_data": [{"index": 0, "records": bytes(
                    make_batch([tag + b"%d" % i for i in range(10)]))}]}]})
        client.send_only(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
            {"name": "pipe", "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
        # All three batches are appended while the first is still unanswered (the stopped
        # child drops out of the ISR only after replica.lag.time.max.ms, 3 s here).
        wait_for(lambda: cluster.log_end_offset(leader, "pipe") == 30, "three pipelined batches appended",
                 timeout=2, interval=0.02)
        readable, _, _ = select.select([client.sock], [], [], 0)
        assert not readable, "the acks=all produce was answered before its ISR had the batch"
    finally:
        child.signal(signal.SIGCONT)
    answers = []
    for _ in range(4):
        frame = client.recv_frame()
        assert frame is not None, "connection closed"
        answers.append(frame)
    assert [struct.unpack_from(">i", f)[0] for f in answers] == [1, 2, 3, 4]   # request order
    def body(key, version, f):
        return api(key).response.decode(f[parse_response_header(f, key, version)[1]:], version)
    produced = [body(ApiKey.PRODUCE, 9, f)["responses"][0]["partition_responses"][0] for f in answers[:3]]
    assert [(p["error_code"], p["base_offset"]) for p in produced] == [(0, 0), (0, 10), (0, 20)]
    latest = body(ApiKey.LIST_OFFSETS, 7, answers[3])["topics"][0]["partitions"][0]
    # It ran after both acks=all answers, so the high watermark it reports covers them.
    assert latest["error_code"] == 0 and latest["offset"] >= 20, latest
    client.close()
    values = [v for _, v in fetch_all(cluster.bootstrap(leader), "pipe", 30)]
    assert values == [t + b"%d" % i for t in (b"a", b"b", b"c") for i in range(10)]


def test_large_fetch_answers_then_small_ones_reach_every_tier(cluster):
    """Receive low-water marks on the replication client (replication/client.py): a
    follower receiving a multi-MiB Fetch answer is woken once per MiB, and the small
    answers after it still wake it (a mark left at the large answer's size would stall
    the tree: acks=all would time out and the grandchild would stop short)."""
    cluster.create_topic("big", configs={"min.insync.replicas": "2", "max.message.bytes": str(8 << 20)})
    leader, _, replicas, _ = tree_of(cluster, "big")
    wait_for(lambda: sorted(tree_of(cluster, "big")[3]) == sorted(replicas[:3]), "full ISR")
    client = RawClient(cluster.bootstrap(leader))
    values = []
    for i in range(6):
        # 3 MiB batches, then single small records: each one acknowledged by the ISR
        batch = [bytes([i]) * 30_000 for _ in range(100)] if i < 3 else [b"small-%d" % i]
        r = produce(client, "big", make_batch(batch, batch_size=8 << 20), acks=-1, timeout_ms=20_000)
        assert r["error_code"] == 0, r
        values += batch
    client.close()
    for node in (replicas[1], replicas[3]):   # a child and the grandchild
        assert [v for _, v in fetch_all(cluster.nodes[node].bootstrap, "big", len(values))] == values
