"""Codec micro-benchmark: µs per decode/encode of the messages on canopy's hot paths.

    .venv/bin/python bench/codec.py

Single-threaded, no I/O: before/after figures for protocol/ changes (machine noise
still applies; compare figures from one run of each side).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.framing import parse_request_header  # noqa: E402
from protocol.messages import ApiKey, api  # noqa: E402
from protocol.records import build_batch  # noqa: E402


def per_call(fn, min_time: float = 0.1, repeat: int = 5) -> float:
    """Best of `repeat` timings of this thread's CPU time (the machine is shared: CPU time
    and the minimum filter out the other processes)."""
    best = float("inf")
    for _ in range(repeat):
        n, t = 0, 0.0
        t0 = time.thread_time()
        while t < min_time:
            for _ in range(20):
                fn()
            n += 20
            t = time.thread_time() - t0
        best = min(best, t / n * 1e6)
    return best


def cases():
    batch = build_batch([(None, b"x" * 100, [], None)])
    produce = api(ApiKey.PRODUCE)
    for v in (7, 9):
        req = produce.request.encode({"acks": 1, "timeout_ms": 30000, "topic_data": [
            {"name": "bench-topic", "partition_data": [{"index": 0, "records": batch}]}]}, v)
        yield f"Produce v{v} request decode (1 partition)", lambda r=req, v=v: \
            produce.request.decode(r, v)
        resp = {"responses": [{"name": "bench-topic", "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": 123, "log_append_time_ms": -1,
             "log_start_offset": 0, "record_errors": [], "error_message": None}]}],
            "throttle_time_ms": 0}
        yield f"Produce v{v} response encode", lambda r=resp, v=v: \
            produce.response.encode(r, v)
    fetch = api(ApiKey.FETCH)
    freq = fetch.request.encode({"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1,
                                 "max_bytes": 52428800, "isolation_level": 0, "topics": [
                                     {"topic": "bench-topic", "partitions": [
                                         {"partition": 0, "fetch_offset": 1000,
                                          "partition_max_bytes": 1048576}]}]}, 12)
    yield "Fetch v12 request decode", lambda: fetch.request.decode(freq, 12)
    md = api(ApiKey.METADATA)
    for v in (1, 12):
        parts = [{"error_code": 0, "partition_index": i, "leader_id": 0, "leader_epoch": 0,
                  "replica_nodes": [0], "isr_nodes": [0], "offline_replicas": []}
                 for i in range(1000)]
        body = {"brokers": [{"node_id": 0, "host": "127.0.0.1", "port": 9092, "rack": None}],
                "cluster_id": "c", "controller_id": 0,
                "topics": [{"error_code": 0, "name": "bench-topic", "is_internal": False,
                            "partitions": parts}]}
        yield f"Metadata v{v} response encode (1000 partitions)", lambda b=body, v=v: \
            md.response.encode(b, v)
    hdr = (b"\x00\x00\x00\x09\x00\x00\x00\x01\x00\x07rdkafka\x00")
    yield "request header parse (v2)", lambda: parse_request_header(hdr)


def main() -> None:
    for name, fn in cases():
        print(f"{per_call(fn):9.2f} µs  {name}")


if __name__ == "__main__":
    main()
