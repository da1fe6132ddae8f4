"""Named listeners (KIP-103) on one broker: `listeners`, `advertised-listeners`,
`listener-security-protocol-map`, `inter-broker-listener-name`.

Metadata, FindCoordinator and DescribeCluster answer with the endpoints of the listener the
request arrived on, so a client is only ever told addresses of the network it came from;
real clients (kafka-python, kcat) produce, consume in a group and list metadata through
each listener. The single `--listen`/`--advertise` form stays one PLAINTEXT listener.
(The cluster case — every listener registered in etcd, replication on the inter-broker
listener, the compose file's INTERNAL/EXTERNAL pair — is tests/cluster/test_listeners.py.)
"""
from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer

from .conftest import CANOPY, ROOT, free_port, require_tool
from .rawclient import RawClient
from .test_cli import _one_line_error, _run


class ListenersBroker:
    """`canopy serve --listeners ...` with two listeners on two loopback addresses."""

    def __init__(self, tmp_path, args: list[str], addresses: list[tuple[str, int]], env: dict | None = None):
        self.addresses = addresses
        self.log_path = tmp_path / "broker.log"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(CANOPY), "serve", "--data-dir", str(tmp_path / "data"), *args],
                                     env=dict(os.environ, **(env or {})),
                                     stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            deadline = time.monotonic() + 30
            pending = list(addresses)
            while pending:
                assert self.proc.poll() is None, self.log_path.read_text()
                assert time.monotonic() < deadline, f"not listening on {pending}:\n{self.log_path.read_text()}"
                try:
                    socket.create_connection(pending[0], timeout=0.5).close()
                    pending.pop(0)
                except OSError:
                    time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def two_listeners(tmp_path):
    internal = ("127.0.0.1", free_port("127.0.0.1"))
    bound_external = ("127.0.0.2", free_port("127.0.0.2"))
    # Two addresses a client can tell apart: each listener must answer with its own.
    b = ListenersBroker(tmp_path, [
        "--listeners", "INTERNAL://%s:%d,EXTERNAL://%s:%d" % (*internal, *bound_external),
        "--advertised-listeners", "EXTERNAL://%s:%d" % bound_external,
        "--listener-security-protocol-map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "--inter-broker-listener-name", "INTERNAL"], [internal, bound_external])
    try:
        yield b, "%s:%d" % internal, "%s:%d" % bound_external
    finally:
        b.stop()


def _brokers(bootstrap: str) -> list[tuple[str, int]]:
    c = RawClient(bootstrap)
    try:
        r = c.request(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        fc = c.request(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})["coordinators"][0]
        dc = c.request(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1})
    finally:
        c.close()
    assert fc["error_code"] == 0, fc
    mine = [(b["host"], b["port"]) for b in r["brokers"]]
    assert [(fc["host"], fc["port"])] == mine
    assert [(b["host"], b["port"]) for b in dc["brokers"]] == mine
    return mine


def test_each_listener_answers_with_its_own_endpoints(two_listeners):
    broker, internal, external = two_listeners
    assert _brokers(internal) == [("127.0.0.1", int(internal.rpartition(":")[2]))]
    assert _brokers(external) == [("127.0.0.2", int(external.rpartition(":")[2]))]
    c = RawClient(internal)
    try:
        r = c.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": [
            "listeners", "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name"]}],
            "include_synonyms": False, "include_documentation": False})
    finally:
        c.close()
    configs = {e["name"]: e["value"] for e in r["results"][0]["configs"]}
    assert configs == {
        "listeners": f"INTERNAL://{internal},EXTERNAL://{external}",
        "advertised.listeners": f"INTERNAL://{internal},EXTERNAL://{external}",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL"}


def test_clients_produce_and_consume_through_either_listener(two_listeners):
    broker, internal, external = two_listeners
    kcat = require_tool("kcat", "Debian package kcat")
    out = subprocess.run([kcat, "-b", external, "-L"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"broker 0 at {external}" in out.stdout, (out.stdout, out.stderr)

    for name, bootstrap in (("in", internal), ("ex", external)):
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        futures = [producer.send(f"via-{name}", value=b"%s-%d" % (name.encode(), i)) for i in range(200)]
        producer.flush(60)
        assert [f.get(30).offset for f in futures] == list(range(200))
        producer.close()
    # A group consumer on EXTERNAL reads both topics: its coordinator (FindCoordinator) and
    # partition leaders (Metadata) are given on EXTERNAL, the only address it knows.
    consumer = KafkaConsumer("via-in", "via-ex", bootstrap_servers=external, group_id="listeners",
                             auto_offset_reset="earliest", consumer_timeout_ms=20000)
    got = sorted(m.value for m in consumer)
    consumer.close()
    assert got == sorted([b"in-%d" % i for i in range(200)] + [b"ex-%d" % i for i in range(200)])


def test_listen_and_advertise_stay_one_plaintext_listener(broker_factory, tmp_path):
    port = free_port()
    b = broker_factory(extra_args=["--advertise", f"localhost:{port}"])
    c = RawClient(b.bootstrap)
    try:
        r = c.request(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        d = c.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": [
            "listeners", "advertised.listeners", "inter.broker.listener.name"]}],
            "include_synonyms": False, "include_documentation": False})
    finally:
        c.close()
    assert [(x["host"], x["port"]) for x in r["brokers"]] == [("localhost", port)]
    assert {e["name"]: e["value"] for e in d["results"][0]["configs"]} == {
        "listeners": f"PLAINTEXT://{b.bootstrap}", "advertised.listeners": f"PLAINTEXT://localhost:{port}",
        "inter.broker.listener.name": "PLAINTEXT"}


@pytest.mark.parametrize("args, needle", [
    (["--listeners", "INTERNAL://127.0.0.1:1"], "no entry in listener-security-protocol-map"),
    (["--listeners", "PLAINTEXT//127.0.0.1:1"], "is not NAME://HOST:PORT"),
    (["--listeners", "PLAINTEXT://127.0.0.1:1,plaintext://127.0.0.1:2"], "appears twice"),
    (["--listeners", "A://127.0.0.1:1,B://127.0.0.1:2", "--listener-security-protocol-map",
      "A:PLAINTEXT,B:PLAINTEXT"], "set inter-broker-listener-name"),
    (["--listeners", "A://127.0.0.1:1", "--listener-security-protocol-map", "A:PLAINTEXT",
      "--inter-broker-listener-name", "B"], "inter-broker-listener-name B is not one of the listeners"),
    (["--listeners", "A://127.0.0.1:1", "--listener-security-protocol-map", "A:TLS"],
     "unknown security protocol 'TLS'"),
    (["--listeners", "PLAINTEXT://127.0.0.1:1", "--advertised-listeners", "OTHER://h:1"], "not in listeners"),
    (["--listeners", "PLAINTEXT://127.0.0.1:1", "--listen", "127.0.0.1:2"], "listen cannot be combined"),
    (["--listeners", "PLAINTEXT://127.0.0.1:1", "--advertise", "h:2"], "advertise cannot be combined"),
    (["--advertised-listeners", "PLAINTEXT://h:1"], "advertised-listeners needs listeners"),
])
def test_bad_listener_options_are_one_line(tmp_path, args, needle):
    _one_line_error(_run(["serve", "--data-dir", str(tmp_path / "d"), *args]), needle)


def test_second_listener_on_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        free = free_port()
        _one_line_error(_run(["serve", "--data-dir", str(tmp_path / "d"), "--listeners",
                              f"PLAINTEXT://127.0.0.1:{free},EXTERNAL://127.0.0.1:{busy}",
                              "--listener-security-protocol-map", "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT"]),
                        "address already in use")


def test_listeners_from_environment(tmp_path):
    port = free_port()
    b = ListenersBroker(tmp_path, [], [("127.0.0.1", port)],
                        env={"CANOPY_LISTENERS": f"CLIENT://127.0.0.1:{port}",
                             "CANOPY_LISTENER_SECURITY_PROTOCOL_MAP": "CLIENT:PLAINTEXT"})
    try:
        assert _brokers(f"127.0.0.1:{port}") == [("127.0.0.1", port)]
    finally:
        b.stop()


def test_empty_host_binds_every_interface(tmp_path):
    """Kafka's `listeners=PLAINTEXT://:9092` form: every interface, advertised (without
    advertised-listeners) as loopback."""
    port = free_port("0.0.0.0")
    b = ListenersBroker(tmp_path, ["--listeners", f"PLAINTEXT://:{port}"], [("127.0.0.1", port), ("127.0.0.2", port)])
    try:
        assert _brokers(f"127.0.0.2:{port}") == [("127.0.0.1", port)]
    finally:
        b.stop()
