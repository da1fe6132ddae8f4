"""The compose.yaml cluster, run as local processes.

Docker is not available here, so the fixture reads compose.yaml and starts every service
as a local process: the etcd services as a real etcd cluster from Debian's package
(tests/etcd_cluster.py; members on 127.0.0.21, .22, ...), the brokers with their own
command and environment, each bound to its own loopback address (127.0.0.11, .12, ... on
one port, as containers would each have an address). Service host names and container
ports in the environment are rewritten to those addresses. A published port (the EXTERNAL
listener, or the HTTP port, `ports: ["H:C"]`) becomes a free port P on 127.0.0.1, as the host sees it:
`0.0.0.0:C` (what the container binds) and `localhost:H` (what it advertises) both become
127.0.0.1:P, and a client there is a client on the host.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, VENV_BIN, free_port
from tests.e2e.rawclient import RawClient
from tests.etcd_cluster import EtcdCluster

CONTAINER_PORT = 9092
ETCD_CLIENT_PORT = 2379


class Node:
    def __init__(self, name: str, node_id: int, host: str, port: int, command: list[str], env: dict, log_path: Path,
                 external: tuple[str, int] | None = None):
        self.name = name
        self.node_id = node_id
        self.host = host
        self.port = port
        self.external = external   # the published (EXTERNAL listener) address, as the host sees it
        self.http: tuple[str, int] | None = None   # the published HTTP port (--http-listen), as the host sees it
        self.command = command
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def external_bootstrap(self) -> str:
        assert self.external is not None, f"{self.name} publishes no port"
        return "%s:%d" % self.external

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen on {self.bootstrap}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            self.paused = sig == signal.SIGSTOP

    paused = False

    @property
    def serving(self) -> bool:
        """Running and not paused: a broker that can answer."""
        return self.alive and not self.paused

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class ComposeCluster:
    def __init__(self, tmp_path: Path, compose_file: Path = ROOT / "compose.yaml"):
        spec = yaml.safe_load(compose_file.read_text())
        services = spec["services"]
        etcd_names = sorted(n for n in services if n.startswith("etcd"))
        broker_names = sorted(n for n in services if n.startswith("canopy"))
        self.etcd = EtcdCluster(tmp_path, size=len(etcd_names),
                                hosts=tuple(f"127.0.0.{21 + i}" for i in range(len(etcd_names))))
        etcd_endpoints = {name: m.endpoint for name, m in zip(etcd_names, self.etcd.members)}
        self.port = free_port("127.0.0.11")
        hosts = {name: f"127.0.0.{11 + i}" for i, name in enumerate(broker_names)}
        self.nodes: dict[int, Node] = {}
        for name in broker_names:
            svc = services[name]
            env = dict(os.environ)
            published = {}   # host port -> container port
            for mapping in svc.get("ports") or []:
                host_port, _, container_port = str(mapping).rpartition(":")
                published[int(host_port)] = int(container_port)
            # each published port as the host sees it
            seen = {hp: ("127.0.0.1", free_port("127.0.0.1")) for hp in published}
            http_port = int(str((svc.get("environment") or {}).get("CANOPY_HTTP_LISTEN", ":0")).rpartition(":")[2])
            external = next((seen[hp] for hp, cp in published.items() if cp != http_port), None)
            http = next((seen[hp] for hp, cp in published.items() if cp == http_port), None)
            for key, value in (svc.get("environment") or {}).items():
                value = str(value)
                for host_port, container_port in published.items():
                    value = value.replace(f"0.0.0.0:{container_port}", "%s:%d" % seen[host_port])
                    value = value.replace(f"localhost:{host_port}", "%s:%d" % seen[host_port])
                for other, ip in hosts.items():
                    value = value.replace(f"{other}:{CONTAINER_PORT}", f"{ip}:{self.port}")
                for other, endpoint in etcd_endpoints.items():
                    value = value.replace(f"{other}:{ETCD_CLIENT_PORT}", endpoint)
                value = value.replace(f"0.0.0.0:{CONTAINER_PORT}", f"{hosts[name]}:{self.port}")
                env[key] = value
            env["CANOPY_DATA_DIR"] = str(tmp_path / name)   # the service's volume
            command = list(svc["command"])
            assert command[0] == "canopy", command
            command[0] = str(VENV_BIN / "canopy")
            node_id = int(env["CANOPY_NODE_ID"])
            self.nodes[node_id] = Node(name, node_id, hosts[name], self.port, command, env,
                                       tmp_path / f"{name}.log", external)
            self.nodes[node_id].http = http
        first = services[broker_names[0]]["environment"]
        self.failure_timeout_ms = int(first["CANOPY_LEADER_FAILURE_TIMEOUT_MS"])
        self.lag_time_ms = int(first["CANOPY_REPLICA_LAG_TIME_MAX_MS"])

    def start(self) -> "ComposeCluster":
        self.etcd.start()
        for n in self.nodes.values():
            n.start()
        for n in self.nodes.values():
            n.wait_listening()
        # Ready: every broker registered, a controller elected, the offsets topic created.
        wait_for(lambda: self._ready(), "every broker registered and a controller elected")
        return self

    def _ready(self) -> bool:
        live = [n for n in self.nodes.values() if n.serving]
        for n in live:
            r = cluster_metadata(n.bootstrap, ["__consumer_offsets"])
            if len(r["brokers"]) != len(live) or r["controller_id"] < 0 or r["topics"][0]["error_code"]:
                return False
        return True

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()
        self.etcd.stop()

    def bootstrap(self, *node_ids: int) -> str:
        ids = node_ids or tuple(self.nodes)
        return ",".join(self.nodes[i].bootstrap for i in ids)

    @property
    def controller_id(self) -> int:
        """The elected controller, as a live broker reports it."""
        node = next(n for n in self.nodes.values() if n.serving)
        return cluster_metadata(node.bootstrap, [])["controller_id"]

    def metadata(self, topic: str, via: int | None = None) -> dict:
        """{partition: (leader, leader_epoch, replicas, isr)} as one broker reports it."""
        node = self.nodes[via] if via is not None else next(n for n in self.nodes.values() if n.serving)
        return partition_metadata(node.bootstrap, topic)

    def create_topic(self, topic: str, partitions: int = 1, configs: dict | None = None, via: int | None = None) -> None:
        node = self.nodes[via if via is not None else self.controller_id]
        c = RawClient(node.bootstrap)
        try:
            r = c.request(19, 5, {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1,
                                              "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
                                  "timeout_ms": 10000})
        finally:
            c.close()
        assert r["topics"][0]["error_code"] == 0, r
        wait_for(lambda: all(self._has_topic(n, topic) for n in self.nodes.values() if n.serving),
                 "topic on every broker")

    def _has_topic(self, node: Node, topic: str) -> bool:
        try:
            self.metadata(topic, via=node.node_id)
            return True
        except (AssertionError, OSError):
            return False

    def log_end_offset(self, node_id: int, topic: str, partition: int = 0) -> int:
        c = RawClient(self.nodes[node_id].bootstrap)
        try:
            r = c.request(2, 7, {"replica_id": -2, "topics": [
                {"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}]})
        finally:
            c.close()
        p = r["topics"][0]["partitions"][0]
        assert p["error_code"] == 0, p
        return p["offset"]


def cluster_metadata(bootstrap: str, topics: list[str]) -> dict:
    c = RawClient(bootstrap)
    try:
        return c.request(3, 12, {"topics": [{"name": t} for t in topics], "allow_auto_topic_creation": False})
    finally:
        c.close()


def partition_metadata(bootstrap: str, topic: str) -> dict:
    """{partition: (leader, leader_epoch, replicas, isr)} as one broker reports it."""
    c = RawClient(bootstrap)
    try:
        r = c.request(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    finally:
        c.close()
    t = r["topics"][0]
    assert t["error_code"] == 0, t
    # (A partition whose leader is gone answers LEADER_NOT_AVAILABLE with leader -1.)
    return {p["partition_index"]: (p["leader_id"], p["leader_epoch"], list(p["replica_nodes"]),
                                   list(p["isr_nodes"])) for p in t["partitions"]}


def wait_formed(bootstraps, count: int) -> None:
    """Every broker (by one bootstrap address each) sees ``count`` registered brokers and an
    elected controller."""
    wait_for(lambda: all(len(cluster_metadata(b, [])["brokers"]) == count
                         and cluster_metadata(b, [])["controller_id"] > 0 for b in bootstraps),
             f"all {count} brokers registered and a controller elected")


@contextlib.contextmanager
def etcd_brokers(tmp_path, etcd_cluster, hosts: dict[int, str], extra_args=lambda n, host: [], env=None):
    """One `canopy serve` per host on a shared port, members of the etcd cluster, started
    and formed; always stopped (resumed first, should a test have paused one)."""
    from tests.e2e.conftest import BrokerProcess
    port = free_port(hosts[min(hosts)])
    brokers = {}
    try:
        for n, h in hosts.items():
            b = BrokerProcess(tmp_path / f"node{n}", port=port, host=h,
                              extra_args=["--node-id", str(n), "--rack", f"rack-{n}", *extra_args(n, h)],
                              env={"CANOPY_METADATA_STORE": etcd_cluster.endpoints, **(env or {})})
            brokers[n] = b
            b.start()
        wait_formed([b.bootstrap for b in brokers.values()], len(hosts))
        yield brokers
    finally:
        for b in brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGCONT)
            b.stop()


def wait_for(cond, what: str, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except (OSError, AssertionError, KeyError, IndexError) as e:
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} ({last_exc!r})")


@pytest.fixture
def cluster(tmp_path):
    c = ComposeCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.stop()
