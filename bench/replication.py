"""Replication bench: a local 4-broker canopy tree on loopback addresses.

    .venv/bin/python bench/replication.py [--records 100000] [--size 1024] [--samples 500]
    .venv/bin/python bench/replication.py --quick     # 20 000 records, 100 samples: a smoke test

Starts one etcd member on 127.0.0.1 (Debian's /usr/bin/etcd; free client and peer ports,
data in the bench's temp dir) for the cluster metadata, then four `canopy serve
--metadata-store etcd://127.0.0.1:P` processes on 127.0.0.11-.14 (one free port, as
containers would each have an address; fanout 2, min.insync.replicas 2). The controller is
whichever broker etcd elects; each topic's tree is read back from Metadata: leader -> two
children -> one grandchild (the compose.yaml shape). Then it measures with confluent-kafka:

- produce throughput, 1 KiB records, acks=1 and acks=all (idempotence off, linger 5 ms,
  1 MiB batches), each on its own fresh topic, deleted once measured (Cluster.delete says
  why): the producer's msg/s (until its last answer) and the replicated msg/s (until
  every replica's log holds every byte the leader's does); the ratios acks=all / acks=1
  of both (issue 15's target: >= 0.9).
  With --rounds N, N pairs of phases on fresh topics in alternating order (acks=1 first in
  odd rounds), so that with an even N each order counts as often (bench/README.md: across
  87 archived rounds, acks=all ran a little slower when it came second). The ratio
  reported is the median of the N rounds' ratios; the round shown in detail is the middle
  one, and with an even N the lower of the two middle ones, never one above the median.
- broker CPU per message: utime+stime of every broker from /proc/<pid>/stat from the first
  record until every replica holds the whole log (the leader's, and each follower's: the
  CPU per replicated message per replica, target <= 1.5 us), and the kernel's part of it
  (stime). --warm-memory G touches and frees G GiB right before each produce phase:
  this VM hands idle memory back to its host, and a page cache growing into such memory
  pays a host page fault per page (bench/README.md, "The VM's memory"); the VM's free
  page reporting is held back while the script runs (brokers.page_reporting_held).
- latency per tree hop: one record at a time (linger 0, acks=1) carrying a sequence number;
  three consumers, bootstrapped only to the leader, a child and that child's grandchild
  with client.rack = their broker's rack (KIP-392: the leader names the follower as
  preferred read replica), record when each sees it; p50/p99 over --samples records of
  producer -> each tier and of each hop (child minus leader, grandchild minus child, per
  record; target p50 <= 1 ms, p99 <= 5 ms). A replica exposes a record only below the
  high watermark it learned from its upstream, so a hop includes the HW's trip.
Everything stays on loopback; the brokers and etcd are stopped at the end, even on failure.
Prints a table and writes bench/results/replication-<ts>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
CANOPY = Path(sys.executable).parent / "canopy"
HOSTS = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13", 4: "127.0.0.14"}
TICK = os.sysconf("SC_CLK_TCK")

# The repository root first: this script's own name would otherwise shadow the
# replication package. bench/ after it, for the bench's helpers (brokers.py).
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
from brokers import PeerUnavailable, debian, held_while_warming, warm_guest_memory  # noqa: E402
from replication.tree import children_of, parent_of  # noqa: E402


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_times(pid: int) -> tuple[float, float]:
    """(user + kernel, kernel) CPU seconds of the process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / TICK, stime / TICK


def cpu_seconds(pid: int) -> float:
    return cpu_times(pid)[0]


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


class Etcd:
    """One etcd member on 127.0.0.1 (Debian's /usr/bin/etcd 3.4) holding the cluster's
    metadata: free client and peer ports, its data directory under the bench's workdir.
    A single member is enough here: the bench measures replication, not etcd failover."""

    def __init__(self, workdir: Path, data_dir: Path | None = None):
        try:
            exe = debian("etcd", "etcd-server")   # apt-get as root when missing, like the bench's peers
        except PeerUnavailable as e:
            raise SystemExit(str(e)) from None
        self.client_port = free_port("127.0.0.1")
        peer_port = free_port("127.0.0.1")
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer_port}"
        log = open(workdir / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [exe, "--name", "bench", "--data-dir", str(data_dir or workdir / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}", "--logger", "zap", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.workdir = workdir

    def wait_healthy(self, timeout: float = 30) -> None:
        # /health answers {"health":"true"} once the member has a leader (itself) and
        # serves reads: only then can a broker load the image and register.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback, never a proxy
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"etcd exited {self.proc.returncode}; see {self.workdir}/etcd.log")
            try:
                with opener.open(f"{self.url}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"etcd not healthy after {timeout:.0f} s; see {self.workdir}/etcd.log")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def endpoint(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


class Cluster:
    """etcd plus four brokers. The controller is whichever broker wins the election in
    etcd, and a topic's tree is whatever the controller assigned: read it from Metadata."""

    def __init__(self, workdir: Path, fanout: int = 2, min_insync: int = 2, log_level: str = "warning",
                 hosts: dict[int, str] | None = None, http: bool = False, etcd_dir: Path | None = None):
        self.log_level = log_level
        self.etcd_dir = etcd_dir   # etcd's data directory, if not under workdir (e.g. on tmpfs)
        self.hosts = dict(hosts or HOSTS)   # node id -> its own loopback address
        self.port = free_port(self.hosts[min(self.hosts)])
        # --http-listen on every broker (its /metrics and /status.json), one free port
        self.http_port = None
        while http and self.http_port in (None, self.port):
            self.http_port = free_port(self.hosts[min(self.hosts)])
        self.workdir = workdir
        self.fanout = fanout
        self.min_insync = min_insync
        self.etcd: Etcd | None = None
        self.procs: dict[int, subprocess.Popen] = {}
        self.controller = -1

    def start(self) -> "Cluster":
        self.etcd = Etcd(self.workdir, self.etcd_dir)
        self.etcd.wait_healthy()
        for n, h in self.hosts.items():
            log = open(self.workdir / f"node{n}.log", "ab")
            http = ["--http-listen", f"{h}:{self.http_port}"] if self.http_port else []
            self.procs[n] = subprocess.Popen(
                [str(CANOPY), "serve", "--metadata-store", self.etcd.endpoint, "--node-id", str(n),
                 "--listen", f"{h}:{self.port}", "--rack", f"rack-{n}", "--data-dir", str(self.workdir / f"node{n}"),
                 "--fanout", str(self.fanout), "--min-insync-replicas", str(self.min_insync),
                 "--log-level", self.log_level, *http],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            log.close()
        for n, h in self.hosts.items():
            deadline = time.monotonic() + 30
            while True:
                self._check_alive(n)
                try:
                    socket.create_connection((h, self.port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"broker {n} did not listen; see {self.workdir}/node{n}.log")
                    time.sleep(0.05)
        # A topic created with replication factor -1 gets one replica per registered
        # broker: wait until every broker's leased registration is in Metadata and a
        # controller has been elected.
        deadline = time.monotonic() + 30
        while True:
            for n in self.hosts:
                self._check_alive(n)
            try:
                md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                if set(md.brokers) == set(self.hosts) and md.controller_id in self.hosts:
                    self.controller = md.controller_id
                    return self
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"brokers never all registered in etcd; see {self.workdir}/node*.log")
            time.sleep(0.2)

    def _check_alive(self, n: int) -> None:
        if self.procs[n].poll() is not None:
            raise SystemExit(f"broker {n} exited {self.procs[n].returncode}; see {self.workdir}/node{n}.log")

    def addr(self, n: int) -> str:
        return f"{self.hosts[n]}:{self.port}"

    def http_url(self, n: int) -> str:
        return f"http://{self.hosts[n]}:{self.http_port}"

    @property
    def bootstrap(self) -> str:
        return ",".join(self.addr(n) for n in self.hosts)

    def cpu(self) -> dict[int, float]:
        return {n: cpu_seconds(p.pid) for n, p in self.procs.items()}

    def cpu_times(self) -> dict[int, tuple[float, float]]:
        """Each broker's (user + kernel, kernel) CPU seconds."""
        return {n: cpu_times(p.pid) for n, p in self.procs.items()}

    def tree(self, topic: str) -> tuple[list[int], list[int]]:
        """(replicas in tree order, committed ISR) of partition 0, as Metadata reports them."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        md = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
        return list(md.replicas), list(md.isrs)

    def create(self, topic: str) -> list[int]:
        """A one-partition topic over every broker; returns its tree once the committed
        ISR is exactly the leader and its direct children (deeper tiers replicate
        asynchronously and never count for acks=all), so the phases start settled."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(topic, 1, -1)])[topic].result(15)
        deadline = time.monotonic() + 30
        replicas: list[int] = []
        isr: list[int] = []
        while time.monotonic() < deadline:
            try:
                replicas, isr = self.tree(topic)
                if len(replicas) == len(self.hosts) and \
                        set(isr) == {replicas[0], *children_of(replicas, replicas[0], self.fanout)}:
                    return replicas
            except Exception:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{topic}: ISR never settled to leader + direct children (tree {replicas}, isr {isr})")

    def topic_dir(self, node: int, topic: str) -> Path:
        """Where broker ``node`` keeps ``topic`` (canopy's layout: data_dir/topics/<topic>)."""
        return self.workdir / f"node{node}" / "topics" / topic

    def delete(self, topic: str) -> None:
        """Deletes a measured topic and waits until no broker holds its log any more, so
        that every round starts alike: the next phase's page cache reuses its pages (on
        this VM, writes into new page-cache pages cost several times more once a few GiB
        of older files stay cached: bench/README.md, "The VM's memory"), and its partition
        leaves every later replica Fetch. Kept, the rounds drifted apart (bench/README.md,
        "Each phase's topic is deleted once measured")."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.delete_topics([topic])[topic].result(15)
        deadline = time.monotonic() + 30
        while any(self.topic_dir(n, topic).exists() for n in self.hosts):
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic}: still on a broker's disk 30 s after DeleteTopics")
            time.sleep(0.1)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            stop_process(p)
        if self.etcd is not None:
            self.etcd.stop()   # last: brokers that lose etcd while stopping only log warnings


def log_bytes(cluster: Cluster, node: int, topic: str) -> int:
    d = cluster.topic_dir(node, topic) / "0"
    try:
        return sum(f.stat().st_size for f in d.glob("*.log"))
    except FileNotFoundError:   # a segment deleted between glob and stat: none are here
        return 0


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of the process: each is
    a time its thread slept or was preempted, and on this VM a broker pays several times
    the CPU for the work right after one (bench/README.md, "What a message costs at the
    rate acks=all runs")."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except FileNotFoundError:   # a worker thread that ended between listdir and open
            pass
    return total


class ConfluentProducer:
    """The bench's producer: confluent-kafka, idempotence off, linger 5 ms, 1 MiB batches."""

    def __init__(self, cluster: Cluster, topic: str, acks: str, size: int):
        self.topic = topic
        self.acks = acks
        self.payloads = [random.randbytes(size) for _ in range(64)]
        self.p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": acks, "enable.idempotence": False,
                           "linger.ms": 5, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000,
                           "queue.buffering.max.kbytes": 2_000_000, "compression.type": "none"})
        self.p.list_topics(topic, timeout=10)

    def produce(self, n: int) -> None:
        """Sends n records and returns once every one is answered."""
        p, payloads, topic = self.p, self.payloads, self.topic
        for i in range(n):
            while True:
                try:
                    p.produce(topic, payloads[i & 63], partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
        left = p.flush(120)
        if left:
            raise SystemExit(f"acks={self.acks}: {left} records undelivered")


def produce_phase(cluster: Cluster, topic: str, acks: str, n: int, size: int, replicas: list[int],
                  warm_gib: float = 0, producer=ConfluentProducer) -> dict:
    """Produces n records of ``size`` bytes with ``producer`` (a class made with (cluster,
    topic, acks, size) before the clock starts, whose ``produce(n)`` returns once every
    record is answered) and measures the rates and the brokers' CPU."""
    warm_guest_memory(warm_gib)
    sender = producer(cluster, topic, acks, size)
    cpu0 = cluster.cpu_times()
    switches0 = {n_: context_switches(p.pid) for n_, p in cluster.procs.items()}
    t0 = time.perf_counter()
    sender.produce(n)
    secs = time.perf_counter() - t0
    cpu1 = cluster.cpu_times()
    # Replication goes on after the producer's last answer (with acks=1 the followers are
    # still behind; with acks=all the grandchild is): the CPU of replicating every record
    # is taken once every replica's log holds as many bytes as the leader's.
    deadline = time.monotonic() + 120
    want = log_bytes(cluster, replicas[0], topic)
    while any(log_bytes(cluster, r, topic) < want for r in replicas[1:]):
        if time.monotonic() > deadline:
            raise SystemExit(f"acks={acks}: replicas never caught up with the leader's {want} bytes")
        time.sleep(0.01)
    replicated_secs = time.perf_counter() - t0
    cpu2 = cluster.cpu_times()
    switches = {n_: context_switches(p.pid) - switches0[n_] for n_, p in cluster.procs.items()}
    per_broker = {n_: (cpu1[n_][0] - cpu0[n_][0]) / n * 1e6 for n_ in cpu0}
    to_replicas = {n_: (cpu2[n_][0] - cpu0[n_][0]) / n * 1e6 for n_ in cpu0}
    kernel = {n_: (cpu2[n_][1] - cpu0[n_][1]) / n * 1e6 for n_ in cpu0}
    followers = [to_replicas[r] for r in replicas[1:]]
    return {"acks": acks, "records": n, "seconds": secs, "msg_per_s": n / secs, "mb_per_s": n * size / secs / 1e6,
            "cpu_us_per_msg": per_broker, "cpu_us_per_msg_total": sum(per_broker.values()),
            "replicated_seconds": replicated_secs, "replicated_msg_per_s": n / replicated_secs,
            "cpu_us_per_msg_replicated": to_replicas,
            # the kernel's part of it (stime): copying bytes into the page cache and sockets
            "kernel_cpu_us_per_msg_replicated": kernel,
            "follower_kernel_cpu_us_per_msg_mean": sum(kernel[r] for r in replicas[1:]) / len(followers),
            "leader_cpu_us_per_msg": to_replicas[replicas[0]],
            "follower_cpu_us_per_msg_max": max(followers), "follower_cpu_us_per_msg_mean": sum(followers) / len(followers),
            # every broker's, from the first record until every replica holds the log
            "context_switches": switches}


def latency_phase(cluster: Cluster, topic: str, replicas: list[int], samples: int,
                  target: int | None = None) -> dict:
    """One record at a time; a consumer on every replica of the path leader -> ``target``
    (default: the first grandchild, so leader, child, grandchild) records when each sees
    it. A hop is the difference between a replica and its upstream for the same record.
    The top-level p50_ms/p99_ms/max_ms/received are the leader -> ``target`` figures."""
    leader = replicas[0]
    replica = target if target is not None else \
        next(r for r in replicas if parent_of(replicas, r, cluster.fanout) not in (None, replicas[0]))
    path = [replica]
    while path[0] != leader:
        path.insert(0, parent_of(replicas, path[0], cluster.fanout))
    names = ["leader", "child", "grandchild"] + [f"tier{d}" for d in range(3, len(path))]
    tiers = dict(zip(names, path))
    arrivals: dict[str, dict[int, int]] = {t: {} for t in tiers}
    done = threading.Event()
    ready = threading.Barrier(len(tiers) + 1)

    def consume(tier: str, node: int) -> None:
        # Bootstrapped only to its broker, with that broker's rack: the leader names it as
        # preferred read replica (KIP-392), so each consumer reads from its own tier.
        c = Consumer({"bootstrap.servers": cluster.addr(node), "group.id": f"bench-repl-{tier}",
                      "client.rack": f"rack-{node}", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 100, "fetch.min.bytes": 1, "socket.nagle.disable": True})
        c.assign([TopicPartition(topic, 0, 0)])
        ready.wait(10)
        mine = arrivals[tier]
        while not done.is_set():
            m = c.poll(0.05)
            if m is not None and not m.error():
                mine[int(m.value()[:20])] = time.perf_counter_ns()
        c.close()

    threads = [threading.Thread(target=consume, args=(t, n), daemon=True) for t, n in tiers.items()]
    for t in threads:
        t.start()
    ready.wait(10)
    p = Producer({"bootstrap.servers": cluster.addr(leader), "acks": "1", "linger.ms": 0,
                  "enable.idempotence": False, "socket.nagle.disable": True})
    p.list_topics(topic, timeout=10)
    time.sleep(1.0)   # consumers joined and fetching
    sent: dict[int, int] = {}
    for i in range(samples):
        ts = time.perf_counter_ns()
        sent[i] = ts
        p.produce(topic, (b"%020d" % i) + b"x" * 80, partition=0)
        p.flush(10)
        time.sleep(0.01)
    deadline = time.monotonic() + 20
    while any(len(a) < samples for a in arrivals.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    for t in threads:
        t.join(10)

    def stats(lat: list[float]) -> dict:
        return {"p50_ms": pct(lat, 0.50) if lat else None, "p99_ms": pct(lat, 0.99) if lat else None,
                "max_ms": max(lat) if lat else None, "received": len(lat)}
    a = arrivals
    order = list(tiers)
    end_to_end = {t: stats([(a[t][i] - sent[i]) / 1e6 for i in sent if i in a[t]]) for t in order}
    hops = {f"{up} -> {down}": stats([(a[down][i] - a[up][i]) / 1e6 for i in sent if i in a[down] and i in a[up]])
            for up, down in zip(order, order[1:])}
    return {"leader": leader, "replica": replica, "path": path, "samples": samples,
            "end_to_end": end_to_end, "hops": hops, **end_to_end[order[-1]]}


def median_round(rounds: list[tuple[dict, dict, dict]]) -> tuple[tuple[dict, dict, dict], float, list[float]]:
    """The round that stands for the run, the median of the rounds' replicated acks=all /
    acks=1 ratios, and those ratios sorted.

    With an odd count the median is the middle round's own ratio. With an even count it
    lies between the two middle rounds, and the round shown is the lower of them: taking
    the upper one (as this script did until 2026-11-28) reported the third-lowest of four
    rounds as "the median", above the median whenever the middle two differ."""
    def ratio_of(r: tuple[dict, dict, dict]) -> float:
        return r[1]["replicated_msg_per_s"] / r[0]["replicated_msg_per_s"]
    ordered = sorted(rounds, key=ratio_of)
    ratios = [ratio_of(r) for r in ordered]
    return ordered[(len(ordered) - 1) // 2], statistics.median(ratios), ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="20 000 records and 100 latency samples")
    ap.add_argument("--rounds", type=int, default=1,
                    help="produce phases per acks setting, each on fresh topics, the order alternating "
                         "(acks=1 first in odd rounds; an even N gives each order as many rounds); the "
                         "median of the rounds' acks=all/acks=1 ratios is reported")
    ap.add_argument("--warm-memory", type=float, default=0, metavar="GIB",
                    help="touch and free this many GiB of memory right before each produce phase, so "
                         "that the page cache grows into host-backed pages (this VM hands idle guest "
                         "memory back to its host: see bench/README.md, \"The VM's memory\"); the VM's "
                         "free page reporting is held back meanwhile where root can; 0: off")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' data directories and logs")
    ap.add_argument("--broker-log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="the brokers' --log-level (their logs are in the temp dir; see --keep)")
    args = ap.parse_args()
    if args.quick:
        args.records, args.samples = 20_000, 100
    workdir = Path(tempfile.mkdtemp(prefix="canopy-repl-bench-"))
    cluster = Cluster(workdir, log_level=args.broker_log_level)
    cleanup = contextlib.ExitStack()
    page_reporting = cleanup.enter_context(held_while_warming(args.warm_memory))
    cleanup.callback(cluster.stop)   # runs first; the page reporting is put back after it
    try:
        cluster.start()
        rounds: list[tuple[dict, dict, dict]] = []
        by_order: dict[str, list[float]] = {"1": [], "all": []}   # each round's ratio, by its first phase
        for i in range(args.rounds):
            suffix = f"-{i + 1}" if args.rounds > 1 else ""
            r1 = cluster.create(f"bench-acks1{suffix}")
            ra = cluster.create(f"bench-acksall{suffix}")
            phases = [("1", f"bench-acks1{suffix}", r1), ("all", f"bench-acksall{suffix}", ra)]
            done = {}
            for acks, topic, reps in (phases if i % 2 == 0 else phases[::-1]):
                done[acks] = produce_phase(cluster, topic, acks, args.records, args.size, reps, args.warm_memory)
                cluster.delete(topic)
            rounds.append((done["1"], done["all"], {f"bench-acks1{suffix}": r1, f"bench-acksall{suffix}": ra}))
            by_order["1" if i % 2 == 0 else "all"].append(
                done["all"]["replicated_msg_per_s"] / done["1"]["replicated_msg_per_s"])
            if args.rounds > 1:
                print(f"round {i + 1} ({'acks=1' if i % 2 == 0 else 'acks=all'} first): replicated msg/s "
                      f"acks=1 {done['1']['replicated_msg_per_s']:.0f}, acks=all {done['all']['replicated_msg_per_s']:.0f}"
                      f" ({done['all']['replicated_msg_per_s'] / done['1']['replicated_msg_per_s']:.2f}); follower CPU "
                      f"us/msg mean {done['1']['follower_cpu_us_per_msg_mean']:.2f} / "
                      f"{done['all']['follower_cpu_us_per_msg_mean']:.2f} (kernel "
                      f"{done['1']['follower_kernel_cpu_us_per_msg_mean']:.2f} / "
                      f"{done['all']['follower_kernel_cpu_us_per_msg_mean']:.2f})", flush=True)
        (acks1, acksall, trees), ratio_replicated, ratios = median_round(rounds)
        rl = cluster.create("bench-latency")
        lat = latency_phase(cluster, "bench-latency", rl, args.samples)
    finally:
        cleanup.close()
    ratio = acksall["msg_per_s"] / acks1["msg_per_s"]
    trees = {**trees, "bench-latency": rl}
    result = {"records": args.records, "size": args.size, "controller": cluster.controller, "trees": trees,
              "acks1": acks1, "acksall": acksall, "ratio_all_vs_1": ratio,
              "rounds": len(rounds), "ratios_all_vs_1_replicated": ratios,
              "ratio_all_vs_1_replicated": ratio_replicated, "ratios_by_first_phase": by_order,
              "latency": lat, "warm_memory_gib": args.warm_memory, "page_reporting": page_reporting,
              "load_avg": os.getloadavg()}
    print(f"4 brokers on {', '.join(HOSTS.values())} + etcd on 127.0.0.1, controller {cluster.controller}, "
          f"fanout {cluster.fanout}, min.insync.replicas {cluster.min_insync}, {args.records} x {args.size} B records"
          + (f", {args.warm_memory:g} GiB of memory warmed before each phase (free page reporting "
             f"{page_reporting})" if args.warm_memory else ""))
    print("trees (breadth-first, leader first): " + ", ".join(f"{t} {r}" for t, r in trees.items()))
    print(f"{'':18}{'msg/s':>9}{'MB/s':>7}{'replicated msg/s':>18}"
          f"{'CPU us/msg: leader':>20}{'follower mean/max':>19}  per broker, to the last replica")
    for r in (acks1, acksall):
        per = " ".join(f"{n}:{v:.2f}" for n, v in sorted(r["cpu_us_per_msg_replicated"].items()))
        print(f"produce acks={r['acks']:<5}{r['msg_per_s']:>9.0f}{r['mb_per_s']:>7.1f}{r['replicated_msg_per_s']:>18.0f}"
              f"{r['leader_cpu_us_per_msg']:>20.2f}{r['follower_cpu_us_per_msg_mean']:>12.2f}"
              f" / {r['follower_cpu_us_per_msg_max']:.2f}  {per}")
    for r in (acks1, acksall):
        per = " ".join(f"{n}:{v:.2f}" for n, v in sorted(r["kernel_cpu_us_per_msg_replicated"].items()))
        print(f"  of which kernel, acks={r['acks']:<5}{'':27}{per}")
    shown = acksall["replicated_msg_per_s"] / acks1["replicated_msg_per_s"]
    print(f"ratio acks=all / acks=1: producer {ratio:.2f}, until every replica has every record "
          f"{ratio_replicated:.2f} (target >= 0.9)"
          + (f"; the median of {len(rounds)} rounds (all: {', '.join(f'{x:.2f}' for x in ratios)})"
             if len(rounds) > 1 else "")
          + (f"; the round shown, the lower middle one: {shown:.2f}" if len(rounds) % 2 == 0 else ""))
    rows = [(f"producer -> consumer on the {t} {n}", lat["end_to_end"][t])
            for t, n in zip(lat["end_to_end"], lat["path"])] + [(f"hop {h}", v) for h, v in lat["hops"].items()]
    for label, v in rows:
        print(f"latency {label:<40} p50 {v['p50_ms']:6.2f} ms  p99 {v['p99_ms']:6.2f} ms "
              f"({v['received']}/{lat['samples']})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"replication-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"written {path.relative_to(ROOT)}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"brokers' data and logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
