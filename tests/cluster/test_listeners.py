"""Listeners (KIP-103) on the compose.yaml cluster run as local processes: a client on the
host reaches the brokers through their EXTERNAL listener (the published ports) and is told
EXTERNAL addresses; the brokers register every listener in etcd and replicate over INTERNAL.

This is the issue's own repro: before listeners, `kcat -b localhost:19092 -L` listed
`canopy-1:9092`, … which the host cannot resolve.
"""
from __future__ import annotations

import base64
import json
import subprocess

from confluent_kafka import Consumer, Producer

from tests.e2e.conftest import require_tool
from tests.etcd_cluster import gateway_call

from .conftest import ComposeCluster, cluster_metadata, wait_for

N = 2000


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def registrations(cluster) -> dict[int, dict]:
    m = cluster.etcd.members[0]
    code, r = gateway_call(m.host, m.client_port, "/v3/kv/range",
                           {"key": b64("/canopy/brokers/"), "range_end": b64("/canopy/brokers0")}, timeout=5)
    assert code == 200, r
    return {int(base64.b64decode(kv["key"]).decode().rsplit("/", 1)[1]): json.loads(base64.b64decode(kv["value"]))
            for kv in r.get("kvs", [])}


def test_host_client_on_external_listener_produces_and_consumes(cluster):
    nodes = cluster.nodes
    internal = {i: (n.host, n.port) for i, n in nodes.items()}
    external = {i: n.external for i, n in nodes.items()}
    assert len(set(external.values())) == len(nodes)

    # Metadata answers with the endpoints of the listener the request arrived on.
    for n in nodes.values():
        via_external = cluster_metadata(n.external_bootstrap, [])
        assert {b["node_id"]: (b["host"], b["port"]) for b in via_external["brokers"]} == external
        via_internal = cluster_metadata(n.bootstrap, [])
        assert {b["node_id"]: (b["host"], b["port"]) for b in via_internal["brokers"]} == internal

    # Every broker registered all its advertised listeners; host/port (what the other
    # brokers dial for replication and forwarding) is the INTERNAL one.
    regs = registrations(cluster)
    assert set(regs) == set(nodes)
    for i, reg in regs.items():
        assert (reg["host"], reg["port"]) == internal[i], reg
        assert {k: (v["host"], v["port"]) for k, v in reg["listeners"].items()} == \
            {"INTERNAL": internal[i], "EXTERNAL": external[i]}, reg

    # kcat on the host, bootstrapped on one published port, lists reachable addresses.
    kcat = require_tool("kcat", "Debian package kcat")
    out = subprocess.run([kcat, "-b", nodes[2].external_bootstrap, "-L"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for i, (host, port) in external.items():
        assert f"broker {i} at {host}:{port}" in out.stdout, out.stdout
    for host, port in internal.values():
        assert f"{host}:{port}" not in out.stdout, out.stdout

    # acks=all with min.insync.replicas=2: every acknowledged record reached a follower,
    # which fetched it from its upstream over the INTERNAL listener.
    cluster.create_topic("outside", partitions=3, configs={"min.insync.replicas": "2"})
    producer = Producer({"bootstrap.servers": nodes[1].external_bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    failed = []
    for i in range(N):
        producer.produce("outside", value=b"v%d" % i, key=b"k%d" % i,
                         on_delivery=lambda err, msg: err and failed.append(err))
    assert producer.flush(120) == 0
    assert failed == []

    # A group consumer on another published port: its coordinator is found on EXTERNAL too.
    consumer = Consumer({"bootstrap.servers": nodes[3].external_bootstrap, "group.id": "outside-readers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe(["outside"])
        got = set()

        def read_some():
            msg = consumer.poll(1.0)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.add(msg.value())
            return len(got) == N
        wait_for(read_some, f"{N} records through the EXTERNAL listener", timeout=120, interval=0)
        assert got == {b"v%d" % i for i in range(N)}
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    # Each partition's followers hold the records too: replication ran on INTERNAL (the
    # only address the brokers know each other by).
    for p, (leader, _, replicas, _) in cluster.metadata("outside").items():
        end = cluster.log_end_offset(leader, "outside", p)
        wait_for(lambda: all(cluster.log_end_offset(r, "outside", p) == end for r in replicas),
                 f"partition {p} replicated to {replicas}", timeout=60)


def test_leader_without_the_clients_listener_is_listener_not_found(tmp_path):
    """A broker configured without EXTERNAL (as during a rolling change): clients on EXTERNAL
    are not told about it, and partitions it leads answer LISTENER_NOT_FOUND with leader -1,
    as Kafka's MetadataCache does; INTERNAL clients see every broker."""
    c = ComposeCluster(tmp_path)
    four = c.nodes[4]
    four.env["CANOPY_LISTENERS"] = four.env["CANOPY_LISTENERS"].split(",")[0]            # INTERNAL only
    four.env["CANOPY_ADVERTISED_LISTENERS"] = four.env["CANOPY_ADVERTISED_LISTENERS"].split(",")[0]
    assert four.env["CANOPY_LISTENERS"].startswith("INTERNAL://")
    try:
        c.start()
        c.create_topic("rolling", partitions=8)
        internal_view = c.metadata("rolling", via=1)
        led_by_four = {p for p, (leader, *_rest) in internal_view.items() if leader == 4}
        assert led_by_four and len(led_by_four) < 8, internal_view
        r = cluster_metadata(c.nodes[1].external_bootstrap, ["rolling"])
        assert sorted(b["node_id"] for b in r["brokers"]) == [1, 2, 3]
        for p in r["topics"][0]["partitions"]:
            if p["partition_index"] in led_by_four:
                assert (p["error_code"], p["leader_id"]) == (72, -1), p     # LISTENER_NOT_FOUND
            else:
                assert p["error_code"] == 0 and p["leader_id"] == internal_view[p["partition_index"]][0], p
    finally:
        c.stop()
