"""`make bench`: canopy side by side with its peers, same client, same workload, same run.

  W1 throughput   1 partition, N records of 1 KiB and of 100 B, acks=1, linger.ms=5,
                  batch 1 MiB, then consume all from offset 0 with assign (confluent-kafka;
                  kafka-python too, as "what a Python user sees")
  W2 latency      sequential acks=1 produce round trip p50/p99/p99.9; end-to-end
                  produce->consume latency at a fixed 10 000 msg/s
  W3 durability   canopy flush=always (group commit) vs async, 16 concurrent producers
  W4 scale        1 000 partitions: create time, Metadata size/time, 100 producers
  W5 restart      time to the first correct answer of a canopy restarted on 1, 5, 10 GiB

Kafka peers: Tansu 0.6.0 (in-memory only) and nafka (Python + SQLite). Non-Kafka
comparisons with their own Python clients: Redis streams, NATS JetStream, RabbitMQ
streams. Every broker starts fresh per workload on a free 127.0.0.1 port; peers are
installed into .cache/peers by bench/brokers.py. Ratios are canopy/peer from this run.

Writes bench/results/<stamp>.json, <stamp>.md, <stamp>-*.png, the py-spy profile of canopy
under W1 (<stamp>-profile-*.txt) and copies the markdown to bench/results/latest.md.
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
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import confluent_kafka  # noqa: F401
except ImportError:  # pragma: no cover - message for a fresh checkout
    sys.exit("bench: confluent-kafka missing: make venv (it is in the test extras)")

import brokers  # noqa: E402
import kafka_load as kl  # noqa: E402
import other_load  # noqa: E402
import report  # noqa: E402
from progress import Progress  # noqa: E402

ROOT = brokers.ROOT
RESULTS = ROOT / "bench" / "results"
ALL_WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
ALL_PEERS = brokers.KAFKA_PEERS + brokers.OTHER_PEERS


def config(args) -> dict:
    quick = args.quick
    cfg = {
        "records": args.records or (20_000 if quick else 200_000),
        "sizes": [1024, 100],
        "kp_records": 5_000 if quick else 50_000,
        "round_trips": args.round_trips or (300 if quick else 2_000),
        "e2e_rate": 10_000, "e2e_seconds": 1.0 if quick else 5.0,
        "w3_producers": 16, "w3_records": 16_000 if quick else 96_000,
        "w4_partitions": 100 if quick else 1000,
        "w4_producers": 10 if quick else 100, "w4_per_producer": 50 if quick else 100,
        "w5_sizes": [256 << 20] if quick else [int(float(g) * (1 << 30)) for g in args.w5_gb.split(",")],
        "w5_partitions": 8,
        "passes": args.passes,
    }
    return cfg


class Suite:
    def __init__(self, args, cfg: dict, stamp: str) -> None:
        self.args, self.cfg, self.stamp = args, cfg, stamp
        self.runs: dict = collections.defaultdict(dict)   # broker -> workload -> figures
        self.errors: dict = {}
        self.notes: dict = {}

    def broker(self, name: str, tmp: str, **kw) -> brokers.Broker:
        log = RESULTS / f"{self.stamp}-{name}.log"
        if name.startswith("canopy"):
            b = brokers.canopy(tmp, log, **kw)
            b.name = name
        else:
            b = brokers.start(name, tmp, log)
        if b.kind == "kafka":
            brokers.wait_until_serving(b.port)
        self.notes[name] = b.note
        return b

    def each(self, workload: str, names, fn, steps_per: int, key: str | None = None) -> None:
        bar = Progress(f"{workload} ({', '.join(names)})", steps_per * len(names))
        for name in names:
            tmp = tempfile.mkdtemp(prefix=f"bench-{name}-")
            b = None
            try:
                b = self.broker(name, tmp, **({"flush": "always"} if name == "canopy-always"
                                              else {}))
                self.runs[name][key or workload] = fn(b, bar)
            except brokers.PeerUnavailable as e:
                self.errors[f"{name} {workload}"] = f"unavailable: {e}"
            except Exception as e:  # report and go on to the next broker
                msg = f"{type(e).__name__}: {e}"
                if b is not None and not b.alive():
                    msg += f"\nbroker exited {b.proc.returncode}; log tail:\n{brokers.tail(b.log)}"
                if self.args.verbose:
                    traceback.print_exc()
                self.errors[f"{name} {workload}"] = msg
                print(f"\n[{name}] {workload} FAILED: {msg}", file=sys.stderr, flush=True)
            finally:
                if b is not None:
                    b.stop()
                shutil.rmtree(tmp, ignore_errors=True)
        bar.close()

    def run(self) -> None:
        cfg, wl = self.cfg, self.args.workloads
        kafka = (["canopy"] if not self.args.no_canopy else []) + [
            p for p in self.args.peers if p in brokers.KAFKA_PEERS]
        if "W1" in wl:
            self.each("W1", kafka, lambda b, bar: kl.w1(b, cfg, bar), kl.W1_STEPS(cfg))
        if "W1" in wl and self.args.profile and not self.args.no_canopy:
            self.profile()
        if "W2" in wl:
            self.each("W2", kafka, lambda b, bar: kl.w2(b, cfg, bar), 2)
        if "W3" in wl and not self.args.no_canopy:
            self.each("W3", ["canopy", "canopy-always"],
                      lambda b, bar: kl.w3(b, cfg, bar), 1)
        if "W4" in wl:
            self.each("W4", [k for k in kafka if k != "nafka"],
                      lambda b, bar: kl.w4(b, cfg, bar), 1)
        if "W5" in wl and not self.args.no_canopy:
            tmp = tempfile.mkdtemp(prefix="bench-w5-", dir=self.args.w5_dir)
            bar = Progress("W5 (canopy restart)", len(cfg["w5_sizes"]))
            try:
                self.runs["canopy"]["W5"] = kl.w5(cfg, tmp, RESULTS / f"{self.stamp}-w5.log",
                                                  bar)
            except Exception as e:
                self.errors["canopy W5"] = f"{type(e).__name__}: {e}"
                print(f"\n[canopy] W5 FAILED: {e}", file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                bar.close()
        others = [p for p in self.args.peers if p in brokers.OTHER_PEERS]
        if others and ("W1" in wl or "W2" in wl):
            for name in others:
                self.each(f"W1/W2 {name}", [name],
                          lambda b, bar: other_load.run(b, cfg, bar), len(cfg["sizes"]),
                          key="other")

    def profile(self) -> None:
        """W1 1 KiB produce + consume again, py-spy attached to canopy (after the measured
        run, so sampling does not distort the figures)."""
        tmp = tempfile.mkdtemp(prefix="bench-prof-")
        bar = Progress("W1 profile (canopy, py-spy)", 2)
        b = None
        try:
            b = self.broker("canopy", tmp)
            topic = f"prof-{uuid.uuid4().hex[:6]}"
            kl.make_topic(b, topic)
            n, size = self.cfg["records"], self.cfg["sizes"][0]
            prof = {}
            for phase, fn in (("produce", kl.ck_produce), ("consume", kl.ck_consume)):
                prof[phase] = py_spy(b, RESULTS / f"{self.stamp}-profile-{phase}.txt",
                                     lambda: fn(b, topic, n, size, bar))
                bar.step(1)
            self.runs["canopy"]["profile"] = prof
        except Exception as e:
            self.errors["canopy profile"] = f"{type(e).__name__}: {e}"
            print(f"\n[canopy] profile FAILED: {e}", file=sys.stderr, flush=True)
        finally:
            if b is not None:
                b.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            bar.close()


def py_spy(broker: brokers.Broker, raw_out: Path, fn) -> dict:
    """Run fn() with py-spy sampling the broker; return the top self-time functions."""
    exe = brokers.VENV / "bin" / "py-spy"
    if not exe.exists():
        exe = Path(shutil.which("py-spy") or "")
    if not exe.is_file():
        raise RuntimeError("py-spy missing: .venv/bin/pip install py-spy")
    rate = os.environ.get("BENCH_PYSPY_RATE", "200")  # samples/s
    sp = subprocess.Popen([str(exe), "record", "--pid", str(broker.pid), "--rate", rate,
                           "--format", "raw", "-o", str(raw_out), "--nonblocking"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # let py-spy attach
    try:
        figures = fn()
    finally:
        sp.send_signal(signal.SIGINT)
        try:
            sp.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sp.kill()
    self_time: collections.Counter = collections.Counter()
    total = 0
    if raw_out.exists():
        for line in raw_out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            self_time[stack.split(";")[-1]] += int(count)
            total += int(count)
    return {"samples": total, "figures_under_profiler": figures, "stacks": raw_out.name,
            "top_self": [(f, round(100 * c / total, 1))
                         for f, c in self_time.most_common(12)] if total else []}


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
            "note": "broker and clients on the same shared machine, loopback"}


def git_head() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                "protocol", "storage", "broker"], cwd=ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + (" + uncommitted broker changes" if dirty else "")
    except Exception:
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (~2 minutes)")
    ap.add_argument("--workloads", default=",".join(ALL_WORKLOADS),
                    help="comma list of W1..W5 (all)")
    ap.add_argument("--peers", default=",".join(ALL_PEERS),
                    help=f"comma list of {', '.join(ALL_PEERS)} (all); '' for canopy alone")
    ap.add_argument("--no-canopy", action="store_true", help="only the peers")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the py-spy profile of canopy under W1")
    ap.add_argument("--records", type=int, help="W1 records per size (200000)")
    ap.add_argument("--round-trips", type=int, help="W2 sequential produces (2000)")
    ap.add_argument("--passes", type=int, default=3,
                    help="W1 confluent produce/consume passes per broker, best reported (3)")
    ap.add_argument("--w5-gb", default="1,5,10",
                    help="W5 log sizes in GiB, comma list, each filled and restarted (1,5,10)")
    ap.add_argument("--w5-dir", help="where W5 writes its log (default: $TMPDIR)")
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks on failure")
    args = ap.parse_args(argv)
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in args.peers if p not in ALL_PEERS]
    if bad:
        ap.error(f"unknown peers {bad}")

    RESULTS.mkdir(parents=True, exist_ok=True)
    brokers.compile_canopy()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    cfg = config(args)
    t0 = time.monotonic()
    machine = machine_note()
    git = git_head()  # at the start: other sessions may commit while the bench runs
    suite = Suite(args, cfg, stamp)
    suite.run()
    rep = {"timestamp": _dt.datetime.now().isoformat(timespec="seconds"), "git": git,
           "machine": machine, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
           "wall_seconds": round(time.monotonic() - t0, 1),
           "client": {"confluent-kafka": confluent_kafka.version()[0],
                      "librdkafka": confluent_kafka.libversion()[0],
                      "kafka-python": __import__("kafka").__version__},
           "config": cfg, "notes": suite.notes, "runs": suite.runs, "errors": suite.errors}
    # The figures first: a fault in the report's rendering must not lose a run.
    (RESULTS / f"{stamp}.json").write_text(json.dumps(rep, indent=2) + "\n")
    md = report.markdown(rep, stamp)
    charts = report.charts(rep, RESULTS, stamp)
    if charts:
        md += "\n" + "\n".join(f"![{c.stem}]({c.name})" for c in charts) + "\n"
    (RESULTS / f"{stamp}.md").write_text(md)
    (RESULTS / "latest.md").write_text(md)
    print()
    print(md)
    print(f"wrote bench/results/{stamp}.md, .json, {len(charts)} charts "
          f"({rep['wall_seconds']} s)")
    return 1 if suite.errors else 0


if __name__ == "__main__":
    sys.exit(main())
