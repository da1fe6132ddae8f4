"""Fixtures that start a real `canopy serve` process on a free loopback port.

End-to-end tests talk to this process with real clients only (kcat, kafka-python,
confluent-kafka, aiokafka, the Java client); nothing here stands in for the broker.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CANOPY = VENV_BIN / "canopy"
IN_CI = os.environ.get("CI") == "true"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, below the kernel's ephemeral range.

    A port the kernel picks for bind(0) comes from the ephemeral range, which every outgoing
    connection also draws from: between this call and the broker's own bind, an etcd client
    or a replica fetcher could take it ("address already in use"). Ports below the range are
    never handed to connections, and this process never hands one out twice.
    """
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, _EPHEMERAL_LOW)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} below {_EPHEMERAL_LOW}")


def require_tool(path_or_name: str | Path, why: str) -> str:
    """Return the tool's path; in CI a missing tool is a failure, never a skip."""
    found = shutil.which(str(path_or_name)) if not Path(path_or_name).exists() else str(path_or_name)
    if not found:
        msg = f"{path_or_name} not installed ({why}); `make test` installs it"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return found


class BrokerProcess:
    """A `canopy serve` child process with its own data directory and port."""

    def __init__(self, data_dir: Path, port: int | None = None, extra_args=(), env=None,
                 host: str = "127.0.0.1"):
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = list(extra_args)
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> "BrokerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(CANOPY), "serve", "--data-dir", str(self.data_dir),
             "--listen", self.bootstrap, "--node-id", "0", *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"canopy exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"canopy did not listen on {self.bootstrap}:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()


@pytest.fixture
def broker_factory(tmp_path):
    started: list[BrokerProcess] = []

    def make(name: str = "data", **kw) -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, **kw)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """One fresh single-node broker per test."""
    return broker_factory()
