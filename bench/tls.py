"""TLS produce and consume as ratios to plaintext, measured in one run on one broker.

    .venv/bin/python bench/tls.py [--records 200000] [--size 1024] [--passes 3]

One `canopy serve` with a PLAINTEXT and an SSL listener (certificates from trustme, TLS as
the broker negotiates it: 1.3 with Python's defaults); confluent-kafka produces N records of
SIZE bytes through one listener, then consumes them through the same listener, alternating
listeners pass by pass so load from other processes hits both alike. Best pass per case.
Plaintext fetches go out with sendfile; TLS fetches are read from the segment and encrypted
(docs/security.md), so consume is where the ratio shows the cost of TLS.

Ratios, not absolute figures: this machine's 2 shared vCPUs move absolute msg/s by ±30 %
between runs (bench/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trustme
from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
CANOPY = Path(sys.executable).parent / "canopy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def produce(conf: dict, topic: str, n: int, size: int) -> float:
    p = Producer({**conf, "linger.ms": 5, "acks": 1, "enable.idempotence": False,
                  "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(300) == 0
    return time.perf_counter() - start


def consume(conf: dict, topic: str, n: int) -> float:
    c = Consumer({**conf, "group.id": "bench-tls", "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < n:
        for m in c.consume(10000, timeout=1.0):
            if m.error() is None:
                got += 1
    secs = time.perf_counter() - start
    c.close()
    return secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="canopy-bench-tls-") as tmp:
        tmp = Path(tmp)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
        plain, tls = free_port(), free_port()
        log = open(tmp / "broker.log", "wb")
        proc = subprocess.Popen([str(CANOPY), "serve", "--data-dir", str(tmp / "data"),
                                 "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
                                 "--ssl-keystore-location", str(tmp / "server.pem"), "--log-level", "warning"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            deadline = time.monotonic() + 30
            for port in (plain, tls):
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                        break
                    except OSError:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise SystemExit("canopy did not start:\n" + (tmp / "broker.log").read_text())
                        time.sleep(0.05)
            confs = {
                "plaintext": {"bootstrap.servers": f"127.0.0.1:{plain}"},
                "tls": {"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "ssl",
                        "ssl.ca.location": str(tmp / "ca.pem")},
            }
            best: dict[tuple[str, str], float] = {}
            for i in range(args.passes):
                order = ["plaintext", "tls"] if i % 2 == 0 else ["tls", "plaintext"]
                for name in order:
                    topic = f"{name}-{i}"
                    secs = produce(confs[name], topic, args.records, args.size)
                    best[name, "produce"] = min(best.get((name, "produce"), secs), secs)
                    secs = consume(confs[name], topic, args.records)
                    best[name, "consume"] = min(best.get((name, "consume"), secs), secs)
                    print(f"pass {i + 1}/{args.passes} {name} done", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()

    mb = args.records * args.size / 1e6
    out = {"records": args.records, "size": args.size, "passes": args.passes,
           "loadavg": os.getloadavg()[0]}
    print(f"{args.records} records of {args.size} B, best of {args.passes} passes, "
          f"load average {out['loadavg']:.1f}\n")
    print("| path | plaintext msg/s | TLS msg/s | TLS / plaintext |")
    print("|---|---|---|---|")
    for what in ("produce", "consume"):
        p_rate = args.records / best["plaintext", what]
        t_rate = args.records / best["tls", what]
        out[what] = {"plaintext_msg_s": round(p_rate), "tls_msg_s": round(t_rate),
                     "plaintext_mb_s": round(mb / best["plaintext", what], 1),
                     "tls_mb_s": round(mb / best["tls", what], 1), "ratio": round(t_rate / p_rate, 2)}
        print(f"| {what} | {p_rate:,.0f} ({out[what]['plaintext_mb_s']} MB/s) | {t_rate:,.0f} "
              f"({out[what]['tls_mb_s']} MB/s) | {t_rate / p_rate:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
