"""The compose.yaml cluster, run as local processes.

Docker is not available here, so the fixture reads compose.yaml and starts every service
with its own command and environment, each broker bound to its own loopback address
(127.0.0.11, .12, ... on one port, as containers would each have an address): service
host names and the container port in the environment are rewritten to those addresses.
"""
from __future__ import annotations

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

CONTAINER_PORT = 9092


class Node:
    def __init__(self, name: str, node_id: int, host: str, port: int, command: list[str], env: dict, log_path: Path):
        self.name = name
        self.node_id = node_id
        self.host = host
        self.port = port
        self.command = command
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

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
        self.port = free_port("127.0.0.11")
        services = spec["services"]
        names = sorted(services)
        hosts = {name: f"127.0.0.{11 + i}" for i, name in enumerate(names)}
        self.nodes: dict[int, Node] = {}
        for name in names:
            svc = services[name]
            env = dict(os.environ)
            for key, value in (svc.get("environment") or {}).items():
                value = str(value)
                for other, ip in hosts.items():
                    value = value.replace(f"{other}:{CONTAINER_PORT}", f"{ip}:{self.port}")
                value = value.replace(f"0.0.0.0:{CONTAINER_PORT}", f"{hosts[name]}:{self.port}")
                env[key] = value
            env["CANOPY_DATA_DIR"] = str(tmp_path / name)   # the service's volume
            command = list(svc["command"])
            assert command[0] == "canopy", command
            command[0] = str(VENV_BIN / "canopy")
            node_id = int(env["CANOPY_NODE_ID"])
            self.nodes[node_id] = Node(name, node_id, hosts[name], self.port, command, env,
                                       tmp_path / f"{name}.log")
        self.controller_id = int(next(iter(services.values()))["environment"]["CANOPY_CONTROLLER"])
        self.failure_timeout_ms = int(next(iter(services.values()))["environment"]["CANOPY_LEADER_FAILURE_TIMEOUT_MS"])
        self.lag_time_ms = int(next(iter(services.values()))["environment"]["CANOPY_REPLICA_LAG_TIME_MAX_MS"])

    def start(self) -> "ComposeCluster":
        for n in self.nodes.values():
            n.start()
        for n in self.nodes.values():
            n.wait_listening()
        return self

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()

    def bootstrap(self, *node_ids: int) -> str:
        ids = node_ids or tuple(self.nodes)
        return ",".join(self.nodes[i].bootstrap for i in ids)

    def metadata(self, topic: str, via: int | None = None) -> dict:
        """{partition: (leader, leader_epoch, replicas, isr)} as one broker reports it."""
        node = self.nodes[via] if via is not None else next(n for n in self.nodes.values() if n.alive)
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
        wait_for(lambda: all(self._has_topic(n, topic) for n in self.nodes.values() if n.alive),
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


def partition_metadata(bootstrap: str, topic: str) -> dict:
    """{partition: (leader, leader_epoch, replicas, isr)} as one broker reports it."""
    c = RawClient(bootstrap)
    try:
        r = c.request(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    finally:
        c.close()
    t = r["topics"][0]
    assert t["error_code"] == 0, t
    return {p["partition_index"]: (p["leader_id"], p["leader_epoch"], list(p["replica_nodes"]),
                                   list(p["isr_nodes"])) for p in t["partitions"]}


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
    c.start()
    yield c
    c.stop()
