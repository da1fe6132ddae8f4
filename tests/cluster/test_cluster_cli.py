"""`canopy cluster describe` and `canopy cluster promote` against a real 3-broker cluster:
three `canopy serve` processes on 127.0.0.11/.12/.13 (one port, as containers would each
have their own address) and a real three-member etcd; the controller is whichever broker
won the election. The CLI runs as a real process too."""
from __future__ import annotations

import re
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import CANOPY, free_port

from .conftest import cluster_metadata, etcd_brokers
from .conftest import partition_metadata as metadata
from .conftest import wait_for

HOSTS = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}


@pytest.fixture
def cluster3(tmp_path, etcd_cluster):
    with etcd_brokers(tmp_path, etcd_cluster, HOSTS,
                      env={"CANOPY_FANOUT": "2", "CANOPY_MIN_INSYNC_REPLICAS": "2"}) as brokers:
        yield brokers


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(CANOPY), "cluster", *args], capture_output=True, text=True, timeout=timeout)


def create_topic(brokers, name: str, partitions: int = 1, configs: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": brokers[2].bootstrap})
    admin.create_topics([NewTopic(name, partitions, -1, config=configs or {})])[name].result(15)
    # every broker applied the metadata record and the ISR holds all direct children
    wait_for(lambda: all(len(metadata(b.bootstrap, name)) == partitions for b in brokers.values()),
             f"{name} on every broker")


def test_describe_shows_brokers_controller_and_trees(cluster3):
    create_topic(cluster3, "wide", partitions=2)
    create_topic(cluster3, "chain", configs={"replication.fanout": "1"})
    wait_for(lambda: all(len(isr) == 3 for _, _, _, isr in metadata(cluster3[1].bootstrap, "wide").values()),
             "full ISR of wide")
    r = cli("describe", "--bootstrap", cluster3[3].bootstrap)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    port = cluster3[1].port
    for n, h in HOSTS.items():
        assert f"  {n}  {h}:{port}  rack=rack-{n}" in out, out
    c = cluster_metadata(cluster3[1].bootstrap, [])["controller_id"]
    line = f"  {c}  {HOSTS[c]}:{port}  rack=rack-{c}  (controller)"
    assert line in out and "(controller)" not in out.replace(line, ""), out
    assert re.search(rf"^cluster canopy-cluster  controller {c}  epoch \d+$", out, re.M), out
    # etcd's health, member by member, as the broker sees it
    assert out.count(" healthy") == 3 and "(raft leader)" in out, out
    md = metadata(cluster3[1].bootstrap, "wide")
    assert "topic wide  partitions 2  fanout 2" in out, out
    for i, (leader, epoch, replicas, isr) in md.items():
        assert (f"  partition {i}  leader {leader}  epoch {epoch}  replicas [{','.join(map(str, replicas))}]"
                in out), out
        # fanout 2, three replicas: the leader and two direct children
        a, b, c = replicas
        assert f"    {a} (leader)\n      {b} (tier 1)\n      {c} (tier 1)\n" in out, out
    # a per-topic replication.fanout of 1 makes a chain: leader -> child -> grandchild
    assert "topic chain  partitions 1  fanout 1" in out, out
    a, b, c = metadata(cluster3[1].bootstrap, "chain")[0][2]
    assert f"    {a} (leader)\n      {b} (tier 1)\n        {c} (tier 2)" in out, out
    # --topic narrows the output; every broker describes the same trees
    only = cli("describe", "--bootstrap", cluster3[1].bootstrap, "--topic", "chain")
    assert only.returncode == 0, only.stderr
    assert "topic chain" in only.stdout and "topic wide" not in only.stdout
    chain_section = "topic chain" + out.split("topic chain", 1)[1].split("\ntopic ", 1)[0].rstrip("\n")
    # The ISR may legitimately change between the two calls (a child catching up or
    # lagging on a loaded machine), so compare the sections without it.
    without_isr = lambda text: re.sub(r"  committed isr \[[0-9,]*\]", "", text)  # noqa: E731
    assert without_isr(only.stdout.rstrip("\n")).endswith(without_isr(chain_section)), (only.stdout, chain_section)


def test_promote_changes_leader_and_producing_continues(cluster3):
    topic = "promoted"
    create_topic(cluster3, topic)
    leader, epoch, replicas, _ = metadata(cluster3[1].bootstrap, topic)[0]
    wait_for(lambda: len(metadata(cluster3[leader].bootstrap, topic)[0][3]) == 3, "full ISR")
    bootstrap = ",".join(b.bootstrap for b in cluster3.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "topic.metadata.refresh.interval.ms": 1000})
    errors = []

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            producer.produce(topic, b"m%06d" % i, on_delivery=lambda err, msg: err and errors.append(err))
            producer.poll(0)
        assert producer.flush(60) == 0

    send(0, 2000)
    assert not errors, errors
    target = replicas[1]          # a direct child, in the ISR
    r = cli("promote", topic, "0", str(target), "--bootstrap", cluster3[3].bootstrap)
    assert r.returncode == 0, r.stderr
    assert f"leader {leader} -> {target}" in r.stdout, r.stdout
    # every broker reports the new leader, a bumped epoch, and the old leader as the last leaf
    for b in cluster3.values():
        wait_for(lambda b=b: metadata(b.bootstrap, topic)[0][:2] == (target, epoch + 1),
                 f"new leader on {b.bootstrap}")
    assert metadata(cluster3[2].bootstrap, topic)[0][2] == [target, replicas[2], leader]
    # the same producer carries on through a metadata refresh
    send(2000, 4000)
    assert not errors, errors
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cli-test", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 4000 and time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is not None and not m.error():
            got.append(m.value())
    consumer.close()
    assert got == [b"m%06d" % i for i in range(4000)]
    # promoting the current leader again is a no-op, not an error
    again = cli("promote", topic, "0", str(target), "--bootstrap", cluster3[1].bootstrap)
    assert again.returncode == 0 and "already the leader" in again.stdout


def test_promote_and_describe_errors_are_one_line(cluster3):
    create_topic(cluster3, "errs", configs={"replication.fanout": "1"})
    boot = cluster3[2].bootstrap
    cases = [
        (("promote", "nope", "0", "2", "--bootstrap", boot), "unknown topic 'nope'"),
        (("promote", "errs", "7", "2", "--bootstrap", boot), "unknown partition errs-7"),
        (("promote", "errs", "0", "9", "--bootstrap", boot), "node 9 is not a replica"),
        (("describe", "--topic", "nope", "--bootstrap", boot), "unknown topic 'nope'"),
        (("describe", "--bootstrap", f"127.0.0.1:{free_port()}"), "cannot connect"),
        (("promote", "errs", "0", "2", "--bootstrap", "no-port"), "HOST:PORT"),
    ]
    # the grandchild of a chain is not in the ISR: refused unless --force
    wait_for(lambda: len(metadata(boot, "errs")[0][3]) == 2, "ISR of errs")
    grandchild = metadata(boot, "errs")[0][2][2]
    cases.append((("promote", "errs", "0", str(grandchild), "--bootstrap", boot), "not in the ISR"))
    for args, message in cases:
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
