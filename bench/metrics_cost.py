"""The cost of metrics on W1 produce, as a ratio metrics on / metrics off, in one run.

    .venv/bin/python bench/metrics_cost.py [--records 200000] [--size 1024] [--passes 3]

Two `canopy serve` processes started alike, one without an HTTP port ("off") and one with
`--http-listen` whose /metrics a scraper reads every second ("on", 15x Prometheus' default
scrape rate, so the scrape's own cost shows). confluent-kafka produces N records of SIZE
bytes (W1: acks=1, linger.ms=5, idempotence off) to each, alternating which goes first
pass by pass so load from other processes hits both alike; best and median pass per broker,
and the broker's own CPU time per record (utime+stime from /proc), which contention from
other processes blurs less than msg/s.

What "off" cannot remove: the request path's counters (broker/stats.py: a histogram
bucket and a few integer additions per request) are always there; their cost against the
code before them is what `bench/produce_ab.py --base <rev>` measures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tls import CANOPY, ROOT, free_port, produce  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """utime + stime of the broker process (10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(tmp: Path, name: str, http: int | None):
    port = free_port()
    argv = [str(CANOPY), "serve", "--data-dir", str(tmp / name), "--listen", f"127.0.0.1:{port}",
            "--log-level", "warning"]
    if http:
        argv += ["--http-listen", f"127.0.0.1:{http}"]
    log = open(tmp / f"{name}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    import socket
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"canopy did not start:\n{(tmp / f'{name}.log').read_text()}")
            time.sleep(0.05)
    return proc, log, port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="canopy-bench-metrics-") as tmp:
        tmp = Path(tmp)
        http = free_port()
        off = start(tmp, "off", None)
        on = start(tmp, "on", http)
        stop = threading.Event()
        scrapes = [0]

        def scraper():
            while not stop.wait(1.0):
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
                    r.read()
                scrapes[0] += 1

        t = threading.Thread(target=scraper, daemon=True)
        t.start()
        best: dict[str, float] = {}
        every: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}   # broker CPU µs per record, per pass
        try:
            for i in range(args.passes):
                for name in (["off", "on"] if i % 2 == 0 else ["on", "off"]):
                    proc, _, port = off if name == "off" else on
                    cpu0 = cpu_seconds(proc.pid)
                    secs = produce({"bootstrap.servers": f"127.0.0.1:{port}"}, f"w1-{i}", args.records, args.size)
                    best[name] = min(best.get(name, secs), secs)
                    every[name].append(args.records / secs)
                    cpu[name].append((cpu_seconds(proc.pid) - cpu0) / args.records * 1e6)
                    print(f"pass {i + 1}/{args.passes} metrics {name}: {args.records / secs:,.0f} msg/s",
                          file=sys.stderr)
        finally:
            stop.set()
            t.join(15)
            for proc, log, _ in (off, on):
                proc.terminate()
                proc.wait(30)
                log.close()
    rates = {k: args.records / v for k, v in best.items()}
    medians = {k: statistics.median(v) for k, v in every.items()}
    out = {"records": args.records, "size": args.size, "passes": args.passes, "scrapes": scrapes[0],
           "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0],
           "off_msg_s": round(rates["off"]), "on_msg_s": round(rates["on"]),
           "ratio": round(rates["on"] / rates["off"], 3),
           "median_off_msg_s": round(medians["off"]), "median_on_msg_s": round(medians["on"]),
           "median_ratio": round(medians["on"] / medians["off"], 3),
           "passes_off": [round(x) for x in every["off"]], "passes_on": [round(x) for x in every["on"]],
           "cpu_us_per_msg_off": round(statistics.median(cpu["off"]), 3),
           "cpu_us_per_msg_on": round(statistics.median(cpu["on"]), 3)}
    out["cpu_ratio"] = round(out["cpu_us_per_msg_off"] / out["cpu_us_per_msg_on"], 3)
    print(f"W1 produce, {args.records} records of {args.size} B, {args.passes} passes each, "
          f"load average {out['loadavg_start']:.1f} -> {out['loadavg_end']:.1f}, {scrapes[0]} scrapes\n")
    print("| | metrics off msg/s | metrics on (scraped every 1 s) msg/s | on / off |")
    print("|---|---|---|---|")
    print(f"| best pass | {rates['off']:,.0f} | {rates['on']:,.0f} | {out['ratio']:.3f} |")
    print(f"| median pass | {medians['off']:,.0f} | {medians['on']:,.0f} | {out['median_ratio']:.3f} |")
    print(f"| broker CPU µs/record (median; ratio = off/on) | {out['cpu_us_per_msg_off']} | "
          f"{out['cpu_us_per_msg_on']} | {out['cpu_ratio']:.3f} |")
    print(f"\npasses off: {out['passes_off']}\npasses on: {out['passes_on']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
