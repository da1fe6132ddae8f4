"""What a replicated message costs the brokers at the rate acks=all runs (issue 15 item 2).

    .venv/bin/python bench/replication_rate.py [--rounds 3] [--records 200000] [--size 1024]

Item 2's ratio compares acks=all with acks=1, both flat out, on 2 vCPUs that the producer
shares with four brokers. This script asks whether acks=all itself costs the brokers more
per message, or the rate it runs at does. It starts the cluster of bench/replication.py
(etcd and four brokers on 127.0.0.11-.14, fanout 2, min.insync.replicas 2) and measures
with that script's produce_phase (replicated msg/s, the brokers' CPU from /proc, their
context switches) three kinds of phase, each on a fresh topic deleted once measured:

  acks=all      flat out;
  acks=1 paced  at the producer rate of a first acks=all phase (measured, reported as
                round 0, and not counted in the medians);
  acks=1        flat out.

Each round runs the three once, the order rotating from round to round (with --rounds 3
each kind runs first, second and third once), and the report gives each kind's median.

The producer is not confluent-kafka but a raw Produce client: one connection to the
leader, Produce v7 requests each carrying the same pre-encoded batch of 1 000 records
(built with canopy's protocol/ codec), 16 in flight, the most a canopy connection reads
ahead. It costs ~0.7 CPU-us per message where confluent-kafka costs ~1.7 here, so the
brokers get most of the two vCPUs and their own cost decides the rates.
Writes bench/results/replication-rate-<stamp>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
from brokers import held_while_warming, load_module  # noqa: E402
from protocol.framing import encode_request, parse_response_header  # noqa: E402
from protocol.messages import ApiKey, api  # noqa: E402
from protocol.records import build_batch  # noqa: E402

repl_bench = load_module(ROOT / "bench" / "replication.py", "bench_replication")

PRODUCE_VERSION = 7
RECORDS_PER_REQUEST = 1000
IN_FLIGHT = 16   # broker/server.py's MAX_PIPELINED: a connection's requests read ahead
KINDS = ("acks=all", "acks=1 paced", "acks=1")
# In a request frame: size (4), api_key (2), api_version (2), then the correlation id.
CORRELATION_ID, CORRELATION_ID_AT = struct.Struct(">i"), 8


def produce_request(topic: str, acks: int, batch: bytes, correlation_id: int) -> bytes:
    """One framed Produce request for partition 0 of ``topic`` carrying ``batch``."""
    return encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, correlation_id, "bench-raw-producer", {
        "transactional_id": None, "acks": acks, "timeout_ms": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})


class RawProducer:
    """Produce requests of RECORDS_PER_REQUEST records each, IN_FLIGHT at a time, to the
    partition's leader; with ``rate`` (msg/s), request k leaves no earlier than
    k * RECORDS_PER_REQUEST / rate seconds after the first."""

    def __init__(self, cluster, topic: str, acks: str, size: int, rate: float | None = None):
        self.topic = topic
        self.acks = -1 if acks == "all" else int(acks)
        self.rate = rate
        self.batch = build_batch([(None, random.randbytes(size), [], None) for _ in range(RECORDS_PER_REQUEST)])
        leader = cluster.tree(topic)[0][0]
        host, port = cluster.addr(leader).rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.response = api(ApiKey.PRODUCE).response

    def _answer(self, reader) -> None:
        (size,) = struct.unpack(">i", reader.read(4))
        frame = reader.read(size)
        body = self.response.decode(frame[parse_response_header(frame, ApiKey.PRODUCE, PRODUCE_VERSION)[1]:],
                                    PRODUCE_VERSION)
        error = body["responses"][0]["partition_responses"][0]["error_code"]
        if error:
            raise SystemExit(f"raw producer: Produce to {self.topic} answered error code {error}")

    def produce(self, n: int) -> None:
        if n % RECORDS_PER_REQUEST:
            raise SystemExit(f"--records must be a multiple of {RECORDS_PER_REQUEST}")
        requests = n // RECORDS_PER_REQUEST
        # Encoded once: each request differs only in its correlation id, patched in place
        # (re-encoding copied the 1 MiB batch twice per request, on the producer's CPU).
        request = bytearray(produce_request(self.topic, self.acks, self.batch, 0))
        reader = self.sock.makefile("rb")
        sent = answered = 0
        t0 = time.perf_counter()
        try:
            while answered < requests:
                while sent < requests and sent - answered < IN_FLIGHT:
                    if self.rate:
                        wait = t0 + sent * RECORDS_PER_REQUEST / self.rate - time.perf_counter()
                        if wait > 0:
                            if sent > answered:
                                break   # read the answers in flight first
                            time.sleep(wait)
                    sent += 1
                    CORRELATION_ID.pack_into(request, CORRELATION_ID_AT, sent)
                    self.sock.sendall(request)
                self._answer(reader)
                answered += 1
        finally:
            reader.close()
            self.sock.close()


def summary(phases: list[dict]) -> dict:
    med = statistics.median
    return {"phases": len(phases),
            "replicated_msg_per_s": med(p["replicated_msg_per_s"] for p in phases),
            "producer_msg_per_s": med(p["msg_per_s"] for p in phases),
            "brokers_cpu_us_per_msg": med(sum(p["cpu_us_per_msg_replicated"].values()) for p in phases),
            "brokers_kernel_cpu_us_per_msg": med(sum(p["kernel_cpu_us_per_msg_replicated"].values()) for p in phases),
            "context_switches_per_1000_msg": med(sum(p["context_switches"].values()) * 1000 / p["records"]
                                                 for p in phases)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-memory", type=float, default=2, metavar="GIB",
                    help="as bench/replication.py's (touched and freed before each phase)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="canopy-repl-rate-"))
    cluster = repl_bench.Cluster(workdir)
    phases: dict[str, list[dict]] = {k: [] for k in KINDS}
    topics = iter(range(1, 1_000_000))

    def phase(acks: str, rate: float | None = None) -> dict:
        topic = f"bench-rate-{next(topics)}"
        replicas = cluster.create(topic)
        result = repl_bench.produce_phase(cluster, topic, acks, args.records, args.size, replicas,
                                          args.warm_memory, functools.partial(RawProducer, rate=rate))
        cluster.delete(topic)
        return result

    cleanup = contextlib.ExitStack()
    page_reporting = cleanup.enter_context(held_while_warming(args.warm_memory))
    cleanup.callback(cluster.stop)   # runs first; the page reporting is put back after it
    try:
        cluster.start()
        first = phase("all")
        pace = first["msg_per_s"]
        print(f"round 0: acks=all at {pace:.0f} msg/s sets the pace of acks=1 paced", flush=True)
        for i in range(args.rounds):
            order = KINDS[i % 3:] + KINDS[:i % 3]
            for kind in order:
                r = phase("all" if kind == "acks=all" else "1", pace if kind == "acks=1 paced" else None)
                r["round"] = i + 1
                phases[kind].append(r)
                print(f"round {i + 1}: {kind:<13} replicated {r['replicated_msg_per_s']:>8.0f} msg/s, brokers "
                      f"{sum(r['cpu_us_per_msg_replicated'].values()):.2f} CPU-us/msg, "
                      f"{sum(r['context_switches'].values()) * 1000 / r['records']:.1f} switches per 1 000 msgs",
                      flush=True)
    finally:
        cleanup.close()
    table = {k: summary(v) for k, v in phases.items()}
    print(f"\n4 brokers + etcd, {args.records} x {args.size} B records per phase, raw producer "
          f"({RECORDS_PER_REQUEST} records per request, {IN_FLIGHT} in flight); "
          f"medians of {args.rounds} rounds" + (f"; free page reporting {page_reporting}" if page_reporting else ""))
    print(f"{'':15}{'replicated msg/s':>18}{'producer msg/s':>16}{'brokers CPU-us/msg':>20}{'of which kernel':>17}"
          f"{'switches / 1000 msgs':>22}")
    for kind, s in table.items():
        print(f"{kind:<15}{s['replicated_msg_per_s']:>18.0f}{s['producer_msg_per_s']:>16.0f}"
              f"{s['brokers_cpu_us_per_msg']:>20.2f}{s['brokers_kernel_cpu_us_per_msg']:>17.2f}"
              f"{s['context_switches_per_1000_msg']:>22.1f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"replication-rate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"records": args.records, "size": args.size, "rounds": args.rounds,
                                "pace_msg_per_s": pace, "round0": first, "phases": phases, "medians": table,
                                "load_avg": os.getloadavg()}, indent=2))
    print(f"written {path.relative_to(ROOT)}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
