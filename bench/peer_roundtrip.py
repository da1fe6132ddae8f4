"""CPU per Fetch round trip of canopy's inter-broker client (replication/client.py).

A follower's fetch loop is a PeerConnection sending one Fetch after another; at one record
per round (a caught-up tree) its Python and Trio cost per round is what a follower
spends. This starts one canopy, writes a few records, and times round trips of a
one-partition Fetch that returns one record at once, reporting the client process's CPU,
the broker's CPU and the wall time per round trip (bench/README.md, "Fewer trips through
the scheduler").

    .venv/bin/python bench/peer_roundtrip.py [--requests 3000] [--repeat 3]

With PYTHONPATH set to another checkout, that checkout's client (and broker) is measured.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

# canopy's packages come from PYTHONPATH when it is set (the code measured), else from this
# checkout; the bench's broker launcher always from this checkout (it finds .venv here).
# bench/ itself leaves sys.path: its replication.py would shadow the package.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.append(str(Path(__file__).resolve().parents[1]))
_spec = importlib.util.spec_from_file_location("bench_brokers", Path(__file__).with_name("brokers.py"))
brokers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(brokers)

from protocol.messages import ApiKey  # noqa: E402
from replication.client import PeerConnection  # noqa: E402

FETCH = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20,
         "isolation_level": 0, "session_id": 0, "session_epoch": -1,
         "topics": [{"topic": "rt", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                    "fetch_offset": 5, "last_fetched_epoch": -1,
                                                    "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
         "forgotten_topics_data": [], "rack_id": ""}


async def measure(port: int, broker: brokers.Broker, requests: int, repeat: int) -> list[tuple[float, float, float]]:
    conn = PeerConnection("127.0.0.1", port, "bench-peer-roundtrip")
    try:
        for _ in range(300):   # connection, codecs and caches warm
            await conn.request(ApiKey.FETCH, 12, FETCH)
        out = []
        for _ in range(repeat):
            c0, b0, t0 = time.process_time(), broker.cpu(), time.perf_counter()
            for _ in range(requests):
                await conn.request(ApiKey.FETCH, 12, FETCH)
            c1, b1, t1 = time.process_time(), broker.cpu(), time.perf_counter()
            out.append((1e6 * (c1 - c0) / requests, 1e6 * (b1 - b0) / requests, 1e6 * (t1 - t0) / requests))
        return out
    finally:
        await conn.aclose()


def broker_with_records(workdir: Path) -> brokers.Broker:
    """One canopy in workdir holding the ten records FETCH reads from (topic rt)."""
    from confluent_kafka import Producer
    broker = brokers.canopy(str(workdir / "data"), workdir / "broker.log")
    try:
        p = Producer({"bootstrap.servers": f"127.0.0.1:{broker.port}", "log_level": 0})
        for _ in range(10):
            p.produce("rt", b"x" * 100)
        assert p.flush(10) == 0, "records not acknowledged"
    except BaseException:
        broker.stop()
        raise
    return broker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="canopy-peer-rt-"))
    try:
        broker = broker_with_records(workdir)
        try:
            rows = trio.run(measure, broker.port, broker, args.requests, args.repeat)
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    import replication.client
    print(f"replication.client from {replication.client.__file__}")
    for client, server, wall in rows:
        print(f"client CPU {client:6.1f} µs/round trip   broker CPU {server:6.1f} µs   wall {wall:6.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
