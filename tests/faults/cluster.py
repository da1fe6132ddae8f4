"""A canopy cluster of real `canopy serve` processes on loopback addresses, ready for faults.

Every broker gets its own address (127.0.0.41, .42, ... like the compose tests' one address
per container) and its own cgroup (v2) under ``canopy-faults/<run>/n<id>``. The cgroup is
what lets iptables tell brokers apart: on loopback every connection leaves from 127.0.0.1
whatever address it goes to, so "broker 2 cannot reach broker 3" is a DROP rule on packets
*owned by broker 2's cgroup* going to broker 3's address (iptables' ``cgroup`` match), and
"clients cannot reach broker 2" one on packets to broker 2's address owned by anything *not*
in the cluster's cgroup.

The cluster's metadata lives in a real three-member etcd (tests/etcd_cluster.py, members on
127.0.0.51-.53); the controller is whichever broker holds the etcd election. The broker
command line is produced in exactly one place, ``FaultCluster.broker_args``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from tests.e2e.conftest import ROOT, VENV_BIN, free_port
from tests.e2e.rawclient import RawClient
from tests.etcd_cluster import EtcdCluster

CGROUP2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() \
    else Path("/sys/fs/cgroup")
CGROUP_PARENT = "canopy-faults"
FIRST_HOST = 41                      # 127.0.0.41 ... (the compose tests use .11 ...)
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
# libfaketime preloaded without its `faketime` wrapper makes a semaphore and a shared-memory
# object named after the process, and removes them only at a normal exit: a broker the
# harness kills with SIGKILL leaves both in /dev/shm, two files per kill on every run.
SHM = Path("/dev/shm")
FAKETIME_OBJECTS = ("faketime_shm_{pid}", "sem.faketime_sem_{pid}")


def drop_faketime_objects(pid: int) -> None:
    """Remove what libfaketime left in /dev/shm for ``pid``, a process already reaped."""
    for name in FAKETIME_OBJECTS:
        (SHM / name.format(pid=pid)).unlink(missing_ok=True)


def drop_stale_faketime_objects() -> None:
    """Remove libfaketime's objects of processes that no longer exist (an earlier run that
    was itself killed before it could clean up after its brokers)."""
    pids = {path.name.rsplit("_", 1)[1] for path in SHM.glob("*faketime_s[hme]*_*")}
    for pid in pids:
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            drop_faketime_objects(int(pid))


def wait_for(cond, what: str, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except (OSError, AssertionError, KeyError, IndexError) as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} ({last!r})")


class FaultNode:
    def __init__(self, cluster: "FaultCluster", node_id: int):
        self.cluster = cluster
        self.node_id = node_id
        self.host = f"127.0.0.{FIRST_HOST - 1 + node_id}"
        self.port = cluster.port
        self.data_dir = cluster.root / f"n{node_id}"
        self.log_path = cluster.root / f"n{node_id}.log"
        self.cgroup = f"{cluster.cgroup}/n{node_id}"
        # libfaketime reads the clock offset from this file (FAKETIME_TIMESTAMP_FILE);
        # the clock nemesis rewrites it while the broker runs.
        self.faketime_file = cluster.root / f"n{node_id}.faketime"
        self.proc: subprocess.Popen | None = None
        self.paused = False

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command(self) -> tuple[list[str], dict]:
        """The broker's argv and environment: canopy under libfiu (fiu-run -x, so fiu-ctrl
        can make fdatasync/pwrite/write fail in the running process) and libfaketime
        preloaded with a rewritable offset file (the wall clock only: a real clock step
        moves CLOCK_REALTIME, never CLOCK_MONOTONIC)."""
        argv = [str(VENV_BIN / "canopy"), *self.cluster.broker_args(self)]
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPATH"] = str(ROOT)
        if self.cluster.with_faketime:
            if not self.faketime_file.exists():
                self.faketime_file.write_text("+0\n")
            env.update(FAKETIME_TIMESTAMP_FILE=str(self.faketime_file), FAKETIME_CACHE_DURATION="1",
                       FAKETIME_DONT_FAKE_MONOTONIC="1")
            # fiu-run sets LD_PRELOAD to its own libraries, so libfaketime is added after
            # it, by a shell that then execs the broker (one pid throughout, for fiu-ctrl).
            argv = ["sh", "-c", f'export LD_PRELOAD="${{LD_PRELOAD:+$LD_PRELOAD }}{LIBFAKETIME}"; exec "$@"',
                    "sh", *argv]
        if self.cluster.with_fiu:
            # the control fifos (<prefix>-<pid>.in/.out) live in the run's directory
            argv = ["fiu-run", "-x", "-f", str(self.cluster.root / "fiu-ctrl"), *argv]
        return argv, env

    def start(self) -> None:
        self._drop_faketime_objects()   # a restart after a SIGKILL or a crash
        argv, env = self.command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        procs = CGROUP2 / self.cgroup / "cgroup.procs"

        def enter_cgroup():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         preexec_fn=enter_cgroup)
        self.paused = False

    def wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker {self.node_id} exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker {self.node_id} did not listen on {self.bootstrap}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._drop_faketime_objects()

    def _drop_faketime_objects(self) -> None:
        """Once the broker process has exited and been waited for, what libfaketime left of
        it goes (see FAKETIME_OBJECTS)."""
        if self.cluster.with_faketime and self.proc is not None and self.proc.poll() is not None:
            drop_faketime_objects(self.proc.pid)

    def fiu(self, command: str) -> None:
        """Run a libfiu remote-control command in the running broker (fiu-ctrl)."""
        subprocess.run(["fiu-ctrl", "-f", str(self.cluster.root / "fiu-ctrl"), "-c", command, str(self.pid)],
                       check=True, timeout=10, capture_output=True)

    def set_clock_offset(self, seconds: float) -> None:
        tmp = self.faketime_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.0f}\n")
        os.replace(tmp, self.faketime_file)

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class FaultCluster:
    """``size`` brokers, node ids 1..size, and the etcd cluster holding their metadata."""

    def __init__(self, root: Path, size: int = 4, *, with_fiu: bool = True, with_faketime: bool = True,
                 flush: str = "async", failure_timeout_ms: int = 3000, lag_time_ms: int = 3000,
                 min_insync: int = 2):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port(f"127.0.0.{FIRST_HOST}")
        self.cgroup = f"{CGROUP_PARENT}/{uuid.uuid4().hex[:8]}"
        self.with_fiu = with_fiu
        self.with_faketime = with_faketime
        self.flush = flush
        self.failure_timeout_ms = failure_timeout_ms
        self.lag_time_ms = lag_time_ms
        self.min_insync = min_insync
        self.nodes = {i: FaultNode(self, i) for i in range(1, size + 1)}
        self.etcd = EtcdCluster(self.root, hosts=("127.0.0.51", "127.0.0.52", "127.0.0.53"))

    # -- the one place that knows the broker's command line --------------------------------
    def broker_args(self, node: FaultNode) -> list[str]:
        return ["serve", "--data-dir", str(node.data_dir), "--listen", node.bootstrap,
                "--node-id", str(node.node_id), "--metadata-store", self.etcd.endpoints,
                # three brokers hold __consumer_offsets as they would the data
                "--offsets-topic-replication-factor", str(min(3, len(self.nodes))),
                "--fanout", "2", "--min-insync-replicas", str(self.min_insync),
                "--replica-lag-time-max-ms", str(self.lag_time_ms),
                "--leader-failure-timeout-ms", str(self.failure_timeout_ms),
                "--flush", self.flush, "--log-level", "info"]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FaultCluster":
        # cgroups left by a crashed run: rmdir removes only empty ones (no process inside),
        # and only old ones (another run may have made its own a moment ago)
        for stale in (CGROUP2 / CGROUP_PARENT).glob("*/n*"):
            try:
                if time.time() - stale.stat().st_mtime > 3600:
                    stale.rmdir()
                    stale.parent.rmdir()
            except OSError:
                pass
        if self.with_faketime:
            drop_stale_faketime_objects()
        for n in self.nodes.values():
            (CGROUP2 / n.cgroup).mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        for n in self.nodes.values():
            n.start()
        for n in self.nodes.values():
            n.wait_listening()
        wait_for(self._registered, "every broker registered and a controller elected", timeout=60)
        return self

    def _registered(self) -> bool:
        c = RawClient(self.nodes[1].bootstrap)
        try:
            r = c.request(3, 12, {"topics": [], "allow_auto_topic_creation": False})
        finally:
            c.close()
        return len(r["brokers"]) == len(self.nodes) and r["controller_id"] >= 0

    def stop(self) -> None:
        for n in self.nodes.values():   # all at once: each takes a moment to close its logs
            if n.alive:
                n.proc.send_signal(signal.SIGCONT)
                n.proc.terminate()
        for n in self.nodes.values():
            try:
                n.stop()
            except Exception:
                pass
        for n in self.nodes.values():
            try:
                (CGROUP2 / n.cgroup).rmdir()
            except OSError:
                pass
        try:
            (CGROUP2 / self.cgroup).rmdir()
        except OSError:
            pass
        self.etcd.stop()

    def bootstrap(self, *ids: int) -> str:
        return ",".join(self.nodes[i].bootstrap for i in (ids or self.nodes))

    def live(self) -> list[FaultNode]:
        return [n for n in self.nodes.values() if n.alive and not n.paused]

    # -- what the brokers say --------------------------------------------------------------
    def controller_id(self) -> int:
        """The controller (the etcd election's holder) as Metadata names it."""
        for n in self.live():
            try:
                c = RawClient(n.bootstrap)
                try:
                    r = c.request(3, 12, {"topics": [], "allow_auto_topic_creation": False})
                finally:
                    c.close()
                return r["controller_id"]
            except (OSError, AssertionError):
                continue
        raise AssertionError("no broker answered Metadata")

    def metadata(self, topic: str, via: FaultNode | None = None) -> dict:
        """{partition: (leader, leader_epoch, replicas, isr)} as one live broker reports it."""
        nodes = [via] if via is not None else self.live()
        last = None
        for n in nodes:
            try:
                c = RawClient(n.bootstrap)
                c.sock.settimeout(5)
                try:
                    r = c.request(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
                finally:
                    c.close()
                t = r["topics"][0]
                assert t["error_code"] == 0, t
                return {p["partition_index"]: (p["leader_id"], p["leader_epoch"], list(p["replica_nodes"]),
                                               list(p["isr_nodes"])) for p in t["partitions"]}
            except (OSError, AssertionError) as e:
                last = e
        raise AssertionError(f"no broker answered Metadata for {topic}: {last!r}")

    def create_topic(self, topic: str, partitions: int, configs: dict | None = None) -> None:
        def create():
            c = RawClient(self.nodes[self.controller_id()].bootstrap)
            try:
                r = c.request(19, 5, {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": -1,
                                                  "configs": [{"name": k, "value": v}
                                                              for k, v in (configs or {}).items()]}],
                                      "timeout_ms": 10000})
            finally:
                c.close()
            code = r["topics"][0]["error_code"]
            assert code in (0, 36), r   # 36: TOPIC_ALREADY_EXISTS (a retried create)
            return True
        wait_for(create, f"CreateTopics {topic}", timeout=60)
        wait_for(lambda: all(len(self.metadata(topic, via=n)) == partitions for n in self.live()),
                 f"topic {topic} on every broker", timeout=60)
