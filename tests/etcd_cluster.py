"""A real etcd cluster for tests: Debian's etcd 3.4 (`make test` installs etcd-server),
one process per member, each on its own loopback address (127.0.0.21, .22, ...) with free
ports, data directories and logs under the test's tmp_path.

Faults are real: kill9() is SIGKILL, pause()/resume() are SIGSTOP/SIGCONT. No etcd process
outlives the test: the fixture stops every member, an atexit hook kills what is left if
the interpreter exits early, and members started from the main thread get
PR_SET_PDEATHSIG so that even a SIGKILLed pytest takes them with it.
"""
from __future__ import annotations

import atexit
import base64
import ctypes
import http.client
import json
import os
import platform
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import free_port, require_tool

# Raft timings for quick tests: a leader is elected ~1 s after the old one vanishes
# (etcd's defaults, 100 ms / 1000 ms, are already short; set explicitly so tests that
# wait for an election know the bound they rely on).
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000

_live: set["EtcdMember"] = set()


def _kill_leftovers() -> None:
    for m in list(_live):
        m.kill9()


atexit.register(_kill_leftovers)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL it when pytest dies.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def _etcd_env() -> dict:
    env = dict(os.environ)
    # etcd 3.4 refuses to start on architectures it does not support officially unless
    # told the GOARCH name; amd64 and arm64 need nothing.
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())
    if arch is None:
        env.setdefault("ETCD_UNSUPPORTED_ARCH", platform.machine())
    return env


def gateway_call(host: str, port: int, path: str, body: dict | None = None,
                 timeout: float = 2.0) -> tuple[int, dict]:
    """One blocking request to a member's JSON gateway: (HTTP status, decoded answer)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, {"raw": data.decode("utf-8", "replace")}
    finally:
        conn.close()


class EtcdMember:
    def __init__(self, name: str, host: str, client_port: int, peer_port: int, data_dir: Path,
                 log_path: Path, initial_cluster: str, etcd: str = "etcd"):
        self.name = name
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.initial_cluster = initial_cluster
        self.etcd = etcd
        self.proc: subprocess.Popen | None = None
        self.paused = False

    def __repr__(self) -> str:
        return f"EtcdMember({self.name} {self.endpoint})"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def start(self) -> "EtcdMember":
        """Start (or restart after kill9/stop: the data directory makes it rejoin)."""
        assert not self.alive, f"{self.name} already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [self.etcd, "--name", self.name, "--data-dir", str(self.data_dir),
               "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
               "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
               "--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new",
               "--initial-cluster-token", f"canopy-test-{os.getpid()}",
               "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_TIMEOUT_MS),
               "--logger", "zap", "--log-outputs", "stderr"]
        # PR_SET_PDEATHSIG fires when the forking *thread* exits: a member started from a
        # worker thread (trio.to_thread) would be killed when that thread is retired, so
        # only the main thread asks for it; the fixture and atexit cover the rest.
        in_main = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_etcd_env(),
                                         stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if in_main else None)
        self.paused = False
        _live.add(self)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.paused = False
        _live.discard(self)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (after SIGCONT if paused); SIGKILL if it has not exited in `timeout` s
        (a leader that cannot reach its peers spends seconds trying to hand over)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.paused = False
        _live.discard(self)

    def pause(self) -> None:
        assert self.alive
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def status(self, timeout: float = 2.0) -> dict | None:
        """/v3/maintenance/status of this member, None if it does not answer."""
        if not self.alive or self.paused:
            return None
        try:
            code, s = gateway_call(self.host, self.client_port, "/v3/maintenance/status", {}, timeout)
        except OSError:
            return None
        return s if code == 200 else None

    def healthy(self, timeout: float = 2.0) -> bool:
        if not self.alive or self.paused:
            return False
        try:
            code, h = gateway_call(self.host, self.client_port, "/health", None, timeout)
        except OSError:
            return False
        return code == 200 and str(h.get("health")) == "true"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""


class EtcdCluster:
    def __init__(self, tmp_path: Path, size: int = 3,
                 hosts: tuple[str, ...] = ("127.0.0.21", "127.0.0.22", "127.0.0.23")):
        if size > len(hosts):
            raise ValueError(f"{size} members need {size} hosts, got {hosts}")
        etcd = require_tool("etcd", "etcd-server: canopy's cluster metadata store")
        base = Path(tmp_path) / "etcd"
        base.mkdir(parents=True, exist_ok=True)
        ports = [(h, free_port(h), free_port(h)) for h in hosts[:size]]
        initial = ",".join(f"etcd{i}=http://{h}:{pp}" for i, (h, _, pp) in enumerate(ports))
        self.members: list[EtcdMember] = [
            EtcdMember(f"etcd{i}", h, cp, pp, base / f"etcd{i}", base / f"etcd{i}.log", initial, etcd)
            for i, (h, cp, pp) in enumerate(ports)]

    @property
    def endpoints(self) -> str:
        """All members as canopy's --metadata-store takes them."""
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    @property
    def endpoint_list(self) -> list[tuple[str, int]]:
        return [(m.host, m.client_port) for m in self.members]

    def start(self, timeout: float = 30) -> "EtcdCluster":
        """Start every member; return once a put is committed and every member is healthy."""
        for m in self.members:
            m.start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        put = {"key": base64.b64encode(b"tests/etcd_cluster/ready").decode(), "value": ""}
        committed = False
        while time.monotonic() < deadline:
            for m in self.members:
                if not m.alive and not committed:
                    raise RuntimeError(f"{m.name} exited with {m.proc.returncode}:\n{m.log_text()}")
            if not committed:
                for m in self.members:
                    try:
                        code, _ = gateway_call(m.host, m.client_port, "/v3/kv/put", put, timeout=2)
                    except OSError:
                        continue
                    if code == 200:
                        committed = True
                        break
            if committed and all(m.healthy() for m in self.members if m.alive and not m.paused):
                return
            time.sleep(0.1)
        logs = "\n".join(f"--- {m.name}\n{m.log_text()[-2000:]}" for m in self.members)
        raise RuntimeError(f"etcd cluster not ready within {timeout}s\n{logs}")

    def leader(self) -> EtcdMember | None:
        """The member that is Raft leader, as the members that answer see it."""
        by_id = {}
        leader_id = None
        for m in self.members:
            s = m.status()
            if s is None:
                continue
            by_id[int(s["header"]["member_id"])] = m
            if s.get("leader") and not s.get("errors"):
                leader_id = int(s["leader"])
        return by_id.get(leader_id)

    def stop(self) -> None:
        """Stop every member (SIGCONT first); idempotent. SIGKILL: the data is thrown away
        with tmp_path, and a graceful SIGTERM costs seconds per member while the leader
        tries to hand leadership to followers that are exiting too."""
        for m in self.members:
            if m.alive:
                m.proc.send_signal(signal.SIGCONT)
            m.kill9()


@pytest.fixture
def etcd_cluster(tmp_path):
    """A fresh three-member etcd cluster per test, stopped afterwards."""
    cluster = EtcdCluster(tmp_path)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
