"""Nemeses: each one a real mechanism acting on a real broker process.

* signals: SIGKILL then a restart on the same data directory; SIGSTOP ... SIGCONT;
* iptables: DROP rules in the harness's own chain ``CANOPY_FAULTS`` (see ``Firewall``);
* libfaketime: the broker's wall clock stepped forwards or backwards while it runs;
* libfiu: fdatasync/fsync made to fail in the running broker (``fiu-ctrl``);
* a small tmpfs filled up under one broker's data directory.

A nemesis picks its victims when a round starts (the leader of partition 0, one of its
children, the controller: whoever they are at that moment), breaks something in
``start`` and heals it in ``heal``.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .cluster import FaultCluster, FaultNode

CHAIN = "CANOPY_FAULTS"


def _ipt(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=check, timeout=30)


class Firewall:
    """Partitions with iptables, confined to the test's brokers.

    Everything lives in the chain ``CANOPY_FAULTS``; OUTPUT jumps to it only for TCP
    packets to a test broker's address and port. A packet belongs to the process whose
    socket sent it, and on loopback every connection leaves from 127.0.0.1, so rules tell
    brokers apart by their cgroup (``-m cgroup --path``). On loopback OUTPUT sees every
    packet once, so no INPUT rules are needed. The chain is flushed and deleted before a
    run (a crashed run leaves nothing that matters) and in ``close``."""

    def __init__(self, cluster: FaultCluster):
        self.cluster = cluster
        self.jumps = [("-d", n.host, "-p", "tcp", "--dport", str(n.port), "-j", CHAIN)
                      for n in cluster.nodes.values()]
        self.jumps += [("-d", m.host, "-p", "tcp", "--dport", str(m.client_port), "-j", CHAIN)
                       for m in cluster.etcd.members]

    @staticmethod
    def remove_leftovers() -> None:
        for base in ("INPUT", "OUTPUT"):
            rules = _ipt("-S", base, check=False).stdout.splitlines()
            for rule in rules:
                if rule.endswith(f"-j {CHAIN}"):
                    _ipt("-D", *rule.split()[1:], check=False)
        _ipt("-F", CHAIN, check=False)
        _ipt("-X", CHAIN, check=False)

    def open(self) -> "Firewall":
        self.remove_leftovers()
        _ipt("-N", CHAIN)
        for j in self.jumps:
            _ipt("-I", "OUTPUT", *j)
        return self

    def close(self) -> None:
        for j in self.jumps:
            _ipt("-D", "OUTPUT", *j, check=False)
        _ipt("-F", CHAIN, check=False)
        _ipt("-X", CHAIN, check=False)

    def cut(self, src: FaultNode, dst: FaultNode) -> None:
        """``src`` can no longer reach ``dst`` (its packets to dst are dropped); dst's own
        connections to src still work."""
        _ipt("-A", CHAIN, "-d", dst.host, "-p", "tcp", "--dport", str(dst.port),
             "-m", "cgroup", "--path", src.cgroup, "-j", "DROP")

    def cut_both(self, a: FaultNode, b: FaultNode) -> None:
        self.cut(a, b)
        self.cut(b, a)

    def cut_clients(self, dst: FaultNode) -> None:
        """Nothing outside the cluster (the clients) reaches ``dst``; brokers still do."""
        _ipt("-A", CHAIN, "-d", dst.host, "-p", "tcp", "--dport", str(dst.port),
             "-m", "cgroup", "!", "--path", self.cluster.cgroup, "-j", "DROP")

    def cut_from_metadata_store(self, src: FaultNode) -> None:
        """``src`` can no longer reach any etcd member: its lease lapses, the others go on."""
        for m in self.cluster.etcd.members:
            _ipt("-A", CHAIN, "-d", m.host, "-p", "tcp", "--dport", str(m.client_port),
                 "-m", "cgroup", "--path", src.cgroup, "-j", "DROP")

    def heal(self) -> None:
        _ipt("-F", CHAIN)


@dataclass
class Victims:
    leader: FaultNode
    children: list[FaultNode]
    controller: FaultNode


class Nemesis:
    name = "?"
    # the cluster this nemesis needs (FaultCluster keyword arguments)
    cluster_options: dict = {}
    duration_s = 4.0

    def __init__(self, cluster: FaultCluster, firewall: Firewall, topic: str):
        self.cluster = cluster
        self.firewall = firewall
        self.topic = topic

    def victims(self) -> Victims:
        leader, _, replicas, _ = self.cluster.metadata(self.topic)[0]
        fanout = 2
        children = [r for i, r in enumerate(replicas) if i and (i - 1) // fanout == 0]
        n = self.cluster.nodes
        return Victims(n[leader], [n[c] for c in children], n[self.cluster.controller_id()])

    def start(self, v: Victims) -> None:
        raise NotImplementedError

    def heal(self, v: Victims) -> None:
        raise NotImplementedError

    def describe(self, v: Victims) -> str:
        return f"{self.name}: leader {v.leader.node_id}, children {[c.node_id for c in v.children]}, " \
               f"controller {v.controller.node_id}"


class Kill9Leader(Nemesis):
    name = "kill9-leader"
    duration_s = 3.5

    def start(self, v):
        v.leader.kill9()

    def heal(self, v):
        v.leader.start()
        v.leader.wait_listening()


class Kill9Follower(Nemesis):
    name = "kill9-follower"

    def start(self, v):
        v.children[0].kill9()

    def heal(self, v):
        v.children[0].start()
        v.children[0].wait_listening()


class _Pause(Nemesis):
    def target(self, v) -> FaultNode:
        raise NotImplementedError

    def start(self, v):
        self._t = self.target(v)
        self._t.pause()

    def heal(self, v):
        self._t.resume()


class PauseLeader(_Pause):
    """Paused past the failure timeout: the controller fails over; the old leader wakes
    up believing it still leads."""
    name = "pause-leader"
    duration_s = 4.5

    def target(self, v):
        return v.leader


class PauseChildrenThenLeader(Nemesis):
    """Issue 10's defect 2 as seen from outside: the leader's children pause for half a
    second (acks=all writes pile up waiting for them), then the leader pauses past the
    failure timeout and resumes as a demoted ex-leader with those writes still waiting."""
    name = "pause-children-then-leader"
    duration_s = 4.5

    def start(self, v):
        for c in v.children:
            c.pause()
        time.sleep(0.5)
        v.leader.pause()
        for c in v.children:
            c.resume()

    def heal(self, v):
        v.leader.resume()


class PauseFollower(_Pause):
    name = "pause-follower"
    duration_s = 4.0

    def target(self, v):
        return v.children[0]


class PauseController(_Pause):
    name = "pause-controller"
    duration_s = 4.0

    def target(self, v):
        return v.controller


class PartitionLeaderChildren(Nemesis):
    """Two-way: the leader and its children cannot reach each other."""
    name = "partition-leader-children"
    duration_s = 4.0

    def start(self, v):
        for c in v.children:
            self.firewall.cut_both(v.leader, c)

    def heal(self, v):
        self.firewall.heal()


class PartitionLeaderControllerOneWay(Nemesis):
    """One-way: the controller cannot reach the leader. Liveness is the leader's etcd
    lease, not the controller's view of it, so nothing may fail over or be lost."""
    name = "partition-controller-to-leader"
    duration_s = 4.0

    def start(self, v):
        if v.controller is not v.leader:
            self.firewall.cut(v.controller, v.leader)

    def heal(self, v):
        self.firewall.heal()


class PartitionLeaderController(Nemesis):
    """Two-way: leader and controller cut from each other."""
    name = "partition-leader-controller"
    duration_s = 4.0

    def start(self, v):
        if v.controller is not v.leader:
            self.firewall.cut_both(v.controller, v.leader)

    def heal(self, v):
        self.firewall.heal()


class PartitionLeaderEtcd(Nemesis):
    """The leader cannot reach etcd but still reaches its children and its clients: its
    lease lapses and a child is elected, while the old leader keeps taking writes. The
    HW over the committed ISR (which holds the new leader, no longer fetching from it)
    keeps it from acknowledging acks=all; its acks=1 tail is truncated when it returns."""
    name = "partition-leader-etcd"
    duration_s = 5.0

    def start(self, v):
        self.firewall.cut_from_metadata_store(v.leader)

    def heal(self, v):
        self.firewall.heal()


class PartitionLeaderClients(Nemesis):
    """Clients cannot reach the leader; brokers can."""
    name = "partition-leader-clients"
    duration_s = 4.0

    def start(self, v):
        self.firewall.cut_clients(v.leader)

    def heal(self, v):
        self.firewall.heal()


class ClockForward(Nemesis):
    """The controller's wall clock jumps an hour ahead (and back when healed)."""
    name = "clock-forward-controller"
    duration_s = 3.0

    def start(self, v):
        self._t = v.controller
        self._t.set_clock_offset(3600)

    def heal(self, v):
        self._t.set_clock_offset(0)


class ClockBackward(Nemesis):
    """The leader's wall clock jumps an hour back (and forward again when healed)."""
    name = "clock-backward-leader"
    duration_s = 3.0

    def start(self, v):
        self._t = v.leader
        self._t.set_clock_offset(-3600)

    def heal(self, v):
        self._t.set_clock_offset(0)


class DiskSyncFailure(Nemesis):
    """fdatasync and fsync fail (EIO) in the running leader, flush policy `always`: it
    must not acknowledge what it could not make durable."""
    name = "disk-fsync-leader"
    cluster_options = {"flush": "always"}
    duration_s = 3.0
    points = ("posix/io/sync/fdatasync", "posix/io/sync/fsync")

    def start(self, v):
        self._t = v.leader
        for p in self.points:
            self._t.fiu(f"enable name={p},failinfo=5")   # failinfo: the errno (EIO)

    def heal(self, v):
        for p in self.points:
            self._t.fiu(f"disable name={p}")
        # A log that failed an fsync is offline until the broker restarts (Kafka: a failed
        # log directory); the operator's remedy is a restart.
        self._t.stop()
        self._t.start()
        self._t.wait_listening()


class DiskFullFollower(Nemesis):
    """A child's data directory is on a small tmpfs that fills up, then frees."""
    name = "disk-full-follower"
    duration_s = 3.0

    def start(self, v):
        self._t = v.children[0]
        mnt = self._t.data_dir
        self._filler = Path(mnt) / "filler"
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * (1 << 20))
        except OSError:
            pass
        finally:
            os.close(fd)

    def heal(self, v):
        self._filler.unlink(missing_ok=True)
        if not self._t.alive:   # a follower that died of the full disk comes back
            self._t.start()
            self._t.wait_listening()


ALL = [Kill9Leader, Kill9Follower, PauseLeader, PauseChildrenThenLeader, PauseFollower, PauseController, PartitionLeaderChildren,
       PartitionLeaderControllerOneWay, PartitionLeaderController, PartitionLeaderEtcd, PartitionLeaderClients,
       ClockForward,
       ClockBackward, DiskSyncFailure, DiskFullFollower]
BY_NAME = {n.name: n for n in ALL}


def mount_tmpfs(path: Path, size_mb: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], check=True,
                   capture_output=True, timeout=30)


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)


def sleep(s: float) -> None:
    time.sleep(s)
