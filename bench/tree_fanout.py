"""Tree versus flat: 7 brokers, one partition, replication factor 7, fan-out 2 against 6.

    .venv/bin/python bench/tree_fanout.py [--records 200000] [--size 1024] [--samples 300]
                                          [--readers 100] [--rate 1000] [--bursts 20] [--seconds 15]
    .venv/bin/python bench/tree_fanout.py --quick     # small counts, ~1 minute: a smoke test

Seed 000 promises that a replication tree lets one leader feed more replicas and readers
than it could alone. Two runs back to back in one invocation, same record counts, each on
a fresh cluster (bench/replication.py's etcd + broker start-up, reused): one etcd member on
127.0.0.1 and seven `canopy serve --fanout F --http-listen ...` on 127.0.0.21-.27.

- run "tree", --fanout 2: leader, 2 children, 4 grandchildren;
- run "flat", --fanout 6: every follower fetches from the leader.

Each run reads its tree back (Metadata's replica list, and every broker's own
/status.json?scope=local: the upstream it fetches from and what its upstream saw of it) and
fails unless the observed tree is the one the fan-out implies. Then, per run:

1. produce: --records x --size B at --produce-rate records/s in --bursts batches a second
   (confluent-kafka, acks=1, linger 5 ms, idempotence off), until all seven replicas hold
   every record. Leader CPU (utime+stime from
   /proc/<pid>/stat) per produced MB and leader egress per produced byte: the record-batch
   bytes the leader put into Fetch responses (its /metrics counters replicationbytesout +
   bytesout) divided by the record-batch bytes it took in (bytesin); and, when iptables is
   usable (root), every TCP byte the leader's listening socket sent (an iptables counting rule
   on source address and port: Kafka framing, TCP/IP headers and ACKs included).
2. latency leader -> deepest replica (the last in breadth-first order: a grandchild in the
   tree, a direct child when flat): bench/replication.py's latency phase, one record at a
   time, a consumer with the replica's client.rack bootstrapped only to it (KIP-392).
3. readers: --readers confluent-kafka consumers (in --reader-procs processes) assign()ed at
   offset 0, while a producer writes --rate records/s for --seconds s carrying its send time
   (in --bursts batches a second);
   once spread over the leaves (client.rack of the leaves, bootstrapped to their leaf: the
   leader names it as preferred read replica), once all on the leader (no client.rack).
   Leader CPU and egress per produced byte (as in 1), every broker's egress, the readers'
   end-to-end latency p50/p99, their lag in records while the producer runs, and the drain:
   how long after the last produce every reader holds every record.

Brokers and etcd are stopped at the end, also on failure. Writes
bench/results/tree-fanout-<stamp>.json and the chart bench/results/tree-fanout-<stamp>.png
(`--chart PATH` for another place, e.g. docs/tree-vs-flat.png).
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository root first, so `replication` is the package, not bench/replication.py;
# bench/ after it for the bench's helpers. bench/replication.py (etcd, Cluster, the latency
# phase) is loaded under its own name.
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
from replication.tree import children_of, parent_of, render  # noqa: E402

import cpu_times  # noqa: E402
from brokers import load_module  # noqa: E402

repl_bench = load_module(ROOT / "bench" / "replication.py", "bench_replication")

HOSTS = {n: f"127.0.0.{20 + n}" for n in range(1, 8)}
RUNS = (("tree", 2), ("flat", 6))
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback, never a proxy


def http_get(url: str, timeout: float = 5) -> bytes:
    with _OPENER.open(url, timeout=timeout) as r:
        return r.read()


_METRIC = re.compile(r'^(kafka_server_brokertopicmetrics_\w+?|kafka_log_log_logendoffset)(?:_total)?'
                     r'\{topic="([^"]*)"\} ([0-9.e+]+)$', re.M)


_REQUESTS = re.compile(r'^kafka_network_requestmetrics_requests_total\{request="(\w+)"\} ([0-9.e+]+)$', re.M)


def topic_metrics(cluster, node: int, topic: str) -> dict[str, float]:
    """This broker's per-topic traffic counters and log end offset from /metrics, and its
    requests answered per API (as "requests:<API>")."""
    text = http_get(cluster.http_url(node) + "/metrics").decode()
    out: dict[str, float] = {}
    for name, t, v in _METRIC.findall(text):
        if t == topic:
            out[name.rsplit("_", 1)[-1]] = float(v)
    for api, v in _REQUESTS.findall(text):
        out[f"requests:{api}"] = float(v)
    return out


class EgressCounter:
    """Every TCP byte the leader's listening socket sends (responses to producers, replicas
    and consumers, with their TCP/IP headers and bare ACKs): an iptables rule with no target
    in OUTPUT only counts and lets the packet go on. The leader's own outgoing connections
    (etcd, its controller duties) leave from ephemeral ports and are not counted. None when
    iptables is not usable (not root)."""

    def __init__(self, host: str, port: int):
        self.rule = ["OUTPUT", "-s", host, "-p", "tcp", "--sport", str(port),
                     "-m", "comment", "--comment", f"canopy-bench-tree-{os.getpid()}-{port}"]
        self.ok = shutil.which("iptables") is not None and os.geteuid() == 0 and \
            self._ipt("-I", *self.rule).returncode == 0

    @staticmethod
    def _ipt(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30)

    def bytes(self) -> int | None:
        if not self.ok:
            return None
        out = self._ipt("-nvxL", "OUTPUT").stdout
        for line in out.splitlines():
            if self.rule[-1] in line:
                return int(line.split()[1])
        return None   # flushed by someone else meanwhile

    def remove(self) -> None:
        if self.ok:
            self._ipt("-D", *self.rule)
            self.ok = False


def observed_tree(cluster, topic: str, fanout: int, timeout: float = 60) -> dict:
    """The tree as the brokers run it: each replica's own upstream (from its
    /status.json?scope=local) and its upstream's record of its fetches. Fails unless it is
    the tree ``fanout`` implies for Metadata's replica list."""
    deadline = time.monotonic() + timeout
    replicas: list[int] = []
    upstream: dict = {}
    seen_by_parent: dict = {}
    while True:
        try:
            # Metadata from any broker: one that has not applied the topic yet answers
            # without its partition, so ask again
            replicas, isr = cluster.tree(topic)
            views = {}
            for n in cluster.hosts:
                v = json.loads(http_get(cluster.http_url(n) + "/status.json?scope=local"))
                views[n] = next((p for p in v["partitions"] if p["topic"] == topic and p["partition"] == 0), None)
        except Exception:   # KeyError (no partition yet), KafkaException, OSError, bad JSON
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
            continue
        upstream = {n: (v or {}).get("upstream") for n, v in views.items()}
        seen_by_parent = {}
        for n in replicas[1:]:
            par = upstream.get(n)
            kids = (views.get(par) or {}).get("children", {}) if par is not None else {}
            seen_by_parent[n] = (kids.get(str(n)) or {}).get("last_fetch_age_ms") is not None
        expected = {n: parent_of(replicas, n, fanout) for n in replicas}
        ok = (len(replicas) == len(cluster.hosts) and views[replicas[0]] and views[replicas[0]]["role"] == "leader"
              and all(upstream[n] == expected[n] for n in replicas[1:]) and all(seen_by_parent.values()))
        if ok:
            depth = {replicas[0]: 0}
            for n in replicas[1:]:
                depth[n] = depth[upstream[n]] + 1
            return {"replicas": replicas, "isr": isr, "upstream": {str(k): v for k, v in upstream.items()},
                    "depth": {str(k): v for k, v in depth.items()}, "lines": render(replicas, fanout)}
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: tree never formed as fanout {fanout} implies: replicas {replicas}, "
                             f"upstreams {upstream}, fetches seen by the upstream {seen_by_parent}")
        time.sleep(0.3)


def wait_replicated(cluster, topic: str, end: int, timeout: float = 120) -> float:
    """Until every broker's log of ``topic`` ends at ``end``; returns when that happened."""
    deadline = time.monotonic() + timeout
    while True:
        ends = {n: topic_metrics(cluster, n, topic).get("logendoffset", 0) for n in cluster.hosts}
        if all(e >= end for e in ends.values()):
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: replicas never reached offset {end}: {ends}")
        time.sleep(0.05)


class Snapshot:
    """Leader CPU, every broker's counters for one topic, the leader's wire egress."""

    def __init__(self, cluster, topic: str, leader: int, egress: EgressCounter):
        self.t = time.perf_counter()
        self.cpu = cluster.cpu()
        self.metrics = {n: topic_metrics(cluster, n, topic) for n in cluster.hosts}
        self.wire = egress.bytes()
        self.machine = cpu_times.read()   # was the machine saturated?
        self.leader = leader

    def delta(self, before: "Snapshot", size_hint: int = 0) -> dict:
        def d(n, k):
            return self.metrics[n].get(k, 0) - before.metrics[n].get(k, 0)
        lead = self.leader
        produced = d(lead, "bytesin")
        egress = {n: d(n, "replicationbytesout") + d(n, "bytesout") for n in self.metrics}
        cpu = {n: self.cpu[n] - before.cpu[n] for n in self.cpu}
        wire = self.wire - before.wire if self.wire is not None and before.wire is not None else None
        mb = produced / 1e6 if produced else float("nan")
        shares = cpu_times.shares(before.machine, self.machine)
        # busy: neither idle nor waiting for the disk (time the host stole counts as busy)
        busy = (100 - shares["idle_pct"] - shares["iowait_pct"]) / 100 if shares else float("nan")
        requests = {k.split(":", 1)[1]: d(lead, k) for k in self.metrics[lead] if k.startswith("requests:")}
        return {
            "seconds": self.t - before.t,
            "machine_cpu_busy": busy,
            "leader_requests_per_s": {k: v / (self.t - before.t) for k, v in requests.items() if v},
            "produced_bytes": produced,
            "leader_cpu_s": cpu[lead],
            "leader_cpu_ms_per_mb": cpu[lead] * 1e3 / mb,
            "all_brokers_cpu_ms_per_mb": sum(cpu.values()) * 1e3 / mb,
            "cpu_s_per_broker": {str(n): v for n, v in cpu.items()},
            "leader_egress_bytes": egress[lead],
            "leader_egress_per_produced_byte": egress[lead] / produced if produced else None,
            "leader_replication_egress_per_produced_byte": d(lead, "replicationbytesout") / produced
            if produced else None,
            "leader_consumer_egress_per_produced_byte": d(lead, "bytesout") / produced if produced else None,
            "leader_wire_bytes": wire,
            "leader_wire_per_produced_byte": wire / produced if wire is not None and produced else None,
            "egress_per_produced_byte_per_broker": {str(n): (v / produced if produced else None)
                                                    for n, v in egress.items()},
        }


def paced_produce(p, topic: str, records: int, rate: int, bursts: int, value) -> list[float]:
    """``records`` records at ``rate``/s in ``bursts`` batches a second, each batch's records
    produced back to back (one Produce request after linger.ms); returns every record's send
    time (CLOCK_MONOTONIC, comparable across processes). Paced rather than as fast as the
    client can: every append wakes every long-polling fetcher, so the request rate decides
    what replicas and readers cost; a saturated machine coalesces fetches into fewer, bigger
    ones and its CPU-per-MB then measures the contention, not the topology."""
    per_burst = max(1, rate // bursts)
    sent_at: list[float] = []
    t0 = time.monotonic()
    for i in range(records):
        if i % per_burst == 0:
            delay = t0 + (i // per_burst) / bursts - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        now_ns = time.monotonic_ns()
        sent_at.append(now_ns / 1e9)
        while True:
            try:
                p.produce(topic, value(i, now_ns), partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(120):
        raise SystemExit(f"{topic}: records undelivered")
    return sent_at


def produce_phase(cluster, topic: str, leader: int, args, egress: EgressCounter) -> dict:
    from confluent_kafka import Producer
    payloads = [os.urandom(args.size) for _ in range(64)]
    p = Producer({"bootstrap.servers": cluster.addr(leader), "acks": "1", "enable.idempotence": False,
                  "linger.ms": 5, "batch.size": 1 << 20, "compression.type": "none"})
    p.list_topics(topic, timeout=10)
    before = Snapshot(cluster, topic, leader, egress)
    t0 = time.perf_counter()
    paced_produce(p, topic, args.records, args.produce_rate, args.bursts, lambda i, _: payloads[i & 63])
    t_acked = time.perf_counter()
    t_all = wait_replicated(cluster, topic, args.records)
    out = Snapshot(cluster, topic, leader, egress).delta(before)
    out.update({"records": args.records, "size": args.size, "rate": args.produce_rate, "bursts": args.bursts,
                "produce_msg_per_s": args.records / (t_acked - t0), "all_replicas_after_last_s": t_all - t_acked})
    return out


# -- readers -------------------------------------------------------------------------------

def reader_worker(spec: dict) -> int:
    """One reader process: spec["consumers"] is a list of {bootstrap, rack}; every
    consumer is assign()ed to partition 0 at offset 0 and counts records until it holds
    spec["records"]. Prints JSON lines: "ready", progress every 0.25 s (per-consumer
    counts), and at the end every consumer's finish time and sampled latencies."""
    from confluent_kafka import Consumer, TopicPartition
    topic, target = spec["topic"], spec["records"]
    consumers = []
    for i, c in enumerate(spec["consumers"]):
        conf = {"bootstrap.servers": c["bootstrap"], "group.id": f"bench-tree-{spec['worker']}-{i}",
                "enable.auto.commit": False, "fetch.wait.max.ms": 100, "socket.nagle.disable": True,
                # a small queue per consumer: 100 of them share 2 vCPUs and the memory
                "queued.max.messages.kbytes": 4096}
        if c.get("rack"):
            conf["client.rack"] = c["rack"]
        k = Consumer(conf)
        k.assign([TopicPartition(topic, 0, 0)])
        consumers.append(k)
    counts = [0] * len(consumers)
    finished: list[float | None] = [None] * len(consumers)
    lat: list[float] = []
    print(json.dumps({"ready": True}), flush=True)
    deadline = time.monotonic() + spec["timeout"]
    last = 0.0
    while time.monotonic() < deadline and any(f is None for f in finished):
        got = 0
        for i, k in enumerate(consumers):
            if finished[i] is not None:
                continue
            msgs = k.consume(500, 0)
            if not msgs:
                continue
            now = time.monotonic_ns()
            n = 0
            for m in msgs:
                if m.error() is None:
                    n += 1
            got += n
            counts[i] += n
            # one latency sample per batch and consumer: the newest record's age
            m = msgs[-1]
            if m.error() is None:
                lat.append((now - int(m.value()[:20])) / 1e6)
            if counts[i] >= target:
                finished[i] = time.monotonic()
        t = time.monotonic()
        if t - last >= 0.25:
            print(json.dumps({"t": t, "counts": counts}), flush=True)
            last = t
        if not got:
            time.sleep(0.002)
    print(json.dumps({"t": time.monotonic(), "counts": counts, "finished": finished, "lat_ms": lat}), flush=True)
    for k in consumers:
        k.close()
    return 0


class Readers:
    """--readers consumers spread round-robin over ``procs`` reader processes."""

    def __init__(self, consumers: list[dict], procs: int, topic: str, records: int, timeout: float):
        self.procs: list[subprocess.Popen] = []
        self.progress: list[list[tuple[float, list[int]]]] = []
        self.final: list[dict | None] = []
        self.ready = []
        self.threads = []
        for w in range(procs):
            spec = {"worker": w, "topic": topic, "records": records, "timeout": timeout,
                    "consumers": consumers[w::procs]}
            p = subprocess.Popen([sys.executable, __file__, "--reader-worker", json.dumps(spec)],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT)
            self.procs.append(p)
            self.progress.append([])
            self.final.append(None)
            ev = threading.Event()
            self.ready.append(ev)
            th = threading.Thread(target=self._read, args=(w, p, ev), daemon=True)
            th.start()
            self.threads.append(th)

    def _read(self, w: int, p: subprocess.Popen, ready: threading.Event) -> None:
        for line in p.stdout:
            d = json.loads(line)
            if d.get("ready"):
                ready.set()
            elif "finished" in d:
                self.final[w] = d
            else:
                self.progress[w].append((d["t"], d["counts"]))
        ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        for w, ev in enumerate(self.ready):
            ev.wait(timeout)
            if self.procs[w].poll() is not None and self.final[w] is None:
                raise SystemExit(f"reader process {w} exited {self.procs[w].returncode}")

    def wait_done(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for th in self.threads:
            th.join(5)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def readers_phase(cluster, topic: str, leader: int, mode: str, leaves: list[int], args,
                  egress: EgressCounter) -> dict:
    from confluent_kafka import Producer
    records = args.rate * args.seconds
    if mode == "leaves":
        consumers = [{"bootstrap": cluster.addr(leaves[i % len(leaves)]), "rack": f"rack-{leaves[i % len(leaves)]}"}
                     for i in range(args.readers)]
    else:
        consumers = [{"bootstrap": cluster.addr(leader)} for _ in range(args.readers)]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    readers = Readers(consumers, args.reader_procs, topic, records, timeout=args.seconds + 120)
    try:
        readers.wait_ready()
        time.sleep(2.0)   # every consumer connected and long-polling (leaves: redirected by the leader)
        p = Producer({"bootstrap.servers": cluster.addr(leader), "acks": "1", "enable.idempotence": False,
                      "linger.ms": 5, "compression.type": "none", "socket.nagle.disable": True})
        p.list_topics(topic, timeout=10)
        pad = os.urandom(max(0, args.size - 20))
        before = Snapshot(cluster, topic, leader, egress)
        t0 = time.monotonic()
        sent_at = paced_produce(p, topic, records, args.rate, args.bursts,
                                lambda i, now_ns: b"%020d" % now_ns + pad)
        t_last = time.monotonic()
        readers.wait_done(timeout=120)
        after = Snapshot(cluster, topic, leader, egress)
    finally:
        readers.stop()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)   # the reader processes, reaped above
    finals = [f for f in readers.final if f is not None]
    got = sum(c for f in finals for c in f["counts"])
    finished = [x for f in finals for x in f["finished"]]
    done = [x for x in finished if x is not None]
    lat = sorted(x for f in finals for x in f["lat_ms"])
    # lag: records produced by time t minus what each reader held then, over every progress line
    lags = []
    for prog in readers.progress:
        for t, counts in prog:
            if t > t_last:
                continue
            produced = bisect.bisect_right(sent_at, t)
            lags.extend(max(0, produced - c) for c in counts)
    lags.sort()
    out = after.delta(before)
    out.update({
        "readers_cpu_s": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
        "mode": mode, "readers": args.readers, "reader_procs": args.reader_procs, "records": records,
        "rate": args.rate, "bursts": args.bursts, "size": args.size, "leaves": leaves if mode == "leaves" else [],
        "readers_complete": len(done), "records_read": got, "records_expected": records * args.readers,
        "read_msg_per_s": got / (max(done) - t0) if len(done) == len(finished) and done else got / (time.monotonic() - t0),
        "drain_s": (max(done) - t_last) if len(done) == len(finished) and done else None,
        "latency_p50_ms": repl_bench.pct(lat, 0.5) if lat else None,
        "latency_p99_ms": repl_bench.pct(lat, 0.99) if lat else None,
        "lag_records_p50": repl_bench.pct(lags, 0.5) if lags else None,
        "lag_records_max": lags[-1] if lags else None,
    })
    if len(done) != args.readers:
        print(f"  warning: {args.readers - len(done)} of {args.readers} readers did not read every record",
              file=sys.stderr)
    return out


# -- one run -----------------------------------------------------------------------------

def one_run(name: str, fanout: int, args, workdir: Path) -> dict:
    # etcd's data on tmpfs: its fsyncs would otherwise queue behind the brokers' page-cache
    # writeback (the previous run's logs), its answers take longer than the brokers' etcd
    # timeout, and registrations lapse mid-run. The bench measures replication, not etcd.
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    etcd_dir = Path(tempfile.mkdtemp(prefix="canopy-tree-bench-etcd-", dir=shm))
    cluster = repl_bench.Cluster(workdir / name, fanout=fanout, min_insync=2, hosts=HOSTS, http=True,
                                 log_level=args.broker_log_level, etcd_dir=etcd_dir / "etcd")
    (workdir / name).mkdir(parents=True)
    egress = None
    t0 = time.perf_counter()
    try:
        print(f"[{name}] starting etcd and 7 brokers, fanout {fanout}", file=sys.stderr)
        cluster.start()
        replicas = cluster.create("tree-produce")
        shape = observed_tree(cluster, "tree-produce", fanout)
        leader = replicas[0]
        egress = EgressCounter(HOSTS[leader], cluster.port)
        print(f"[{name}] tree (each replica under the upstream it fetches from):", file=sys.stderr)
        for line in shape["lines"]:
            print("    " + line, file=sys.stderr)
        print(f"[{name}] produce {args.records} x {args.size} B at {args.produce_rate}/s", file=sys.stderr)
        produce = produce_phase(cluster, "tree-produce", leader, args, egress)
        lrep = cluster.create("tree-latency")
        deepest = lrep[-1]   # breadth-first order: the last replica is on the deepest tier
        print(f"[{name}] latency leader {leader} -> deepest replica {deepest}, {args.samples} samples",
              file=sys.stderr)
        lat = repl_bench.latency_phase(cluster, "tree-latency", lrep, args.samples, target=deepest)
        lat["depth"] = shape["depth"][str(deepest)] if lrep == replicas else None
        leaves = [n for n in replicas if not children_of(replicas, n, fanout)]
        readers = {}
        for mode in ("leaves", "leader"):
            topic = f"tree-readers-{mode}"
            rrep = cluster.create(topic)
            print(f"[{name}] {args.readers} readers on the {mode}"
                  f"{' ' + str(leaves) if mode == 'leaves' else ''}, {args.rate} records/s for {args.seconds} s",
                  file=sys.stderr)
            readers[mode] = readers_phase(cluster, topic, rrep[0], mode, leaves, args, egress)
        return {"name": name, "fanout": fanout, "controller": cluster.controller, "tree": shape,
                "egress_measure": "iptables" if egress.ok else "metrics only",
                "produce": produce, "latency": lat, "readers": readers, "wall_s": time.perf_counter() - t0}
    finally:
        if egress is not None:
            egress.remove()
        cluster.stop()
        shutil.rmtree(etcd_dir, ignore_errors=True)


# -- report ------------------------------------------------------------------------------

ROWS = [
    ("produce: leader CPU ms per produced MB", lambda r: r["produce"]["leader_cpu_ms_per_mb"], "{:.1f}"),
    ("produce: all 7 brokers' CPU ms per produced MB", lambda r: r["produce"]["all_brokers_cpu_ms_per_mb"], "{:.1f}"),
    ("produce: leader egress per produced byte (records)", lambda r: r["produce"]["leader_egress_per_produced_byte"],
     "{:.2f}"),
    ("produce: leader egress per produced byte (wire)", lambda r: r["produce"]["leader_wire_per_produced_byte"],
     "{:.2f}"),
    ("produce: all 7 replicas hold every record, s after the last ack",
     lambda r: r["produce"]["all_replicas_after_last_s"], "{:.2f}"),
    ("produce: machine CPU busy (all processes, 2 vCPUs)", lambda r: r["produce"]["machine_cpu_busy"], "{:.0%}"),
    ("latency leader -> deepest replica p50 ms", lambda r: r["latency"]["p50_ms"], "{:.2f}"),
    ("latency leader -> deepest replica p99 ms", lambda r: r["latency"]["p99_ms"], "{:.2f}"),
]
for _mode in ("leaves", "leader"):
    ROWS += [
        (f"readers on the {_mode}: leader CPU ms per produced MB",
         lambda r, m=_mode: r["readers"][m]["leader_cpu_ms_per_mb"], "{:.0f}"),
        (f"readers on the {_mode}: all brokers' CPU ms per produced MB",
         lambda r, m=_mode: r["readers"][m]["all_brokers_cpu_ms_per_mb"], "{:.0f}"),
        (f"readers on the {_mode}: leader egress per produced byte (records)",
         lambda r, m=_mode: r["readers"][m]["leader_egress_per_produced_byte"], "{:.1f}"),
        (f"readers on the {_mode}: leader egress per produced byte (wire)",
         lambda r, m=_mode: r["readers"][m]["leader_wire_per_produced_byte"], "{:.1f}"),
        (f"readers on the {_mode}: records read/s (all readers)",
         lambda r, m=_mode: r["readers"][m]["read_msg_per_s"], "{:,.0f}"),
        (f"readers on the {_mode}: latency p50 ms", lambda r, m=_mode: r["readers"][m]["latency_p50_ms"], "{:.1f}"),
        (f"readers on the {_mode}: latency p99 ms", lambda r, m=_mode: r["readers"][m]["latency_p99_ms"], "{:.1f}"),
        (f"readers on the {_mode}: lag records p50 / max",
         lambda r, m=_mode: (r["readers"][m]["lag_records_p50"], r["readers"][m]["lag_records_max"]), "{} / {}"),
        (f"readers on the {_mode}: drain after last produce s", lambda r, m=_mode: r["readers"][m]["drain_s"],
         "{:.2f}"),
        (f"readers on the {_mode}: reader processes' CPU s", lambda r, m=_mode: r["readers"][m]["readers_cpu_s"],
         "{:.1f}"),
        (f"readers on the {_mode}: machine CPU busy", lambda r, m=_mode: r["readers"][m]["machine_cpu_busy"],
         "{:.0%}"),
    ]


def fmt(f: str, v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, tuple):
        return f.format(*v)
    return f.format(v)


def table(tree: dict, flat: dict) -> str:
    lines = ["| figure | tree (fan-out 2) | flat (fan-out 6) | tree/flat |", "|---|---:|---:|---:|"]
    for label, get, f in ROWS:
        try:
            a, b = get(tree), get(flat)
        except (KeyError, TypeError):
            a = b = None
        ratio = "" if isinstance(a, tuple) or not a or not b or "%" in f else f"{a / b:.2f}"
        lines.append(f"| {label} | {fmt(f, a)} | {fmt(f, b)} | {ratio} |")
    return "\n".join(lines)


def chart(tree: dict, flat: dict, path: Path, meta: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    colours = {"tree": "#2a7ab0", "flat": "#c8553d"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    panels = [
        (axes[0], "Leader egress per produced byte", "record bytes out / byte in (log)", [
            ("7 replicas", lambda r: r["produce"]["leader_egress_per_produced_byte"]),
            ("+100 readers\non leaves", lambda r: r["readers"]["leaves"]["leader_egress_per_produced_byte"]),
            ("+100 readers\non leader", lambda r: r["readers"]["leader"]["leader_egress_per_produced_byte"])]),
        (axes[1], "Leader CPU per produced MB", "CPU ms / MB (log)", [
            ("7 replicas", lambda r: r["produce"]["leader_cpu_ms_per_mb"]),
            ("+100 readers\non leaves", lambda r: r["readers"]["leaves"]["leader_cpu_ms_per_mb"]),
            ("+100 readers\non leader", lambda r: r["readers"]["leader"]["leader_cpu_ms_per_mb"])]),
        (axes[2], "End-to-end latency", "ms, log (bar p50, tick p99)", [
            ("leader ->\ndeepest replica", lambda r: (r["latency"]["p50_ms"], r["latency"]["p99_ms"])),
            ("readers\non leaves", lambda r: (r["readers"]["leaves"]["latency_p50_ms"],
                                              r["readers"]["leaves"]["latency_p99_ms"])),
            ("readers\non leader", lambda r: (r["readers"]["leader"]["latency_p50_ms"],
                                              r["readers"]["leader"]["latency_p99_ms"]))]),
    ]
    width = 0.38
    for ax, title, ylabel, groups in panels:
        for j, (run, off) in enumerate(((tree, -width / 2), (flat, width / 2))):
            for i, (_, get) in enumerate(groups):
                v = get(run)
                p99 = None
                if isinstance(v, tuple):
                    v, p99 = v
                if v is None:
                    continue
                ax.bar(i + off, v, width, color=colours[run["name"]],
                       label=f"{run['name']} (fan-out {run['fanout']})" if i == 0 else None)
                ax.text(i + off, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
                if p99 is not None:
                    ax.plot([i + off - width / 3, i + off + width / 3], [p99, p99], color="black", lw=1.5)
                    ax.plot([i + off, i + off], [v, p99], color="black", lw=0.8)
        ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        # log scale: 100 readers on the leader cost it ~50x what 6 replicas do
        ax.set_yscale("log")
        ax.set_ylim(bottom=1)   # egress 1 = one copy of each byte; 1 ms; 1 CPU-ms
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("canopy: one partition on 7 brokers, replication tree (fan-out 2) vs flat (fan-out 6)",
                 fontsize=11)
    fig.text(0.5, 0.005, meta, ha="center", fontsize=7.5, color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--reader-worker":
        return reader_worker(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000, help="produce phase: records per run (at --produce-rate)")
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ap.add_argument("--samples", type=int, default=300, help="latency phase: records sent one at a time")
    ap.add_argument("--readers", type=int, default=100, help="consumers in each readers phase")
    ap.add_argument("--reader-procs", type=int, default=4, help="processes the readers are spread over")
    ap.add_argument("--rate", type=int, default=1000, help="readers phases: records/s produced")
    ap.add_argument("--produce-rate", type=int, default=20_000, help="produce phase: records/s")
    ap.add_argument("--bursts", type=int, default=20, help="readers phases: produce bursts (batches) per second")
    ap.add_argument("--seconds", type=int, default=15, help="readers phases: seconds of producing")
    ap.add_argument("--quick", action="store_true",
                    help="20 000 records, 100 samples, readers at 1 000 records/s for 5 s (~1 minute; "
                         "too short for CPU figures: a smoke test)")
    ap.add_argument("--chart", type=Path, help="also write the chart here (e.g. docs/tree-vs-flat.png)")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' data directories and logs")
    ap.add_argument("--broker-log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args()
    if args.quick:
        args.records, args.samples, args.rate, args.seconds = 20_000, 100, 1000, 5
    load0 = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    workdir = Path(tempfile.mkdtemp(prefix="canopy-tree-bench-"))
    t0 = time.perf_counter()
    runs = {}
    try:
        for name, fanout in RUNS:
            runs[name] = one_run(name, fanout, args, workdir)
            if not args.keep:
                shutil.rmtree(workdir / name, ignore_errors=True)
            os.sync()   # the next run starts without this one's writeback in flight
    except BaseException:
        print(f"failed: the brokers' and etcd's logs are in {workdir}", file=sys.stderr)
        raise
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    load1 = os.getloadavg()
    tree, flat = runs["tree"], runs["flat"]
    meta = (f"{time.strftime('%Y-%m-%d %H:%M')} git {git}; {args.records} x {args.size} B produced; "
            f"{args.readers} readers at {args.rate} records/s for {args.seconds} s; load average "
            f"{load0[0]:.1f} -> {load1[0]:.1f} on 2 shared vCPUs")
    result = {"stamp": stamp, "git": git, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                   for k, v in vars(args).items()},
              "loadavg_start": load0, "loadavg_end": load1, "wall_s": time.perf_counter() - t0,
              "hosts": HOSTS, "runs": runs}
    for r in (tree, flat):
        print(f"{r['name']} (fanout {r['fanout']}), replicas {r['tree']['replicas']}, controller {r['controller']}:")
        for line in r["tree"]["lines"]:
            print("    " + line)
    print(table(tree, flat))
    print(meta)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"tree-fanout-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    png = out / f"tree-fanout-{stamp}.png"
    chart(tree, flat, png, meta)
    if args.chart:
        shutil.copyfile(png, args.chart)
    print(f"written {path.relative_to(ROOT)}, {png.relative_to(ROOT)}" + (f", {args.chart}" if args.chart else ""))
    if args.keep:
        print(f"brokers' data and logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
