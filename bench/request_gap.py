"""Broker CPU per request, back to back against one request every few milliseconds.

In the replication bench's latency phase (one record per 10 ms) a leader spends ~0.5 ms
of CPU per request it answers, four times what the same requests cost a single broker
answering them back to back. This separates canopy's work from the machine's: one canopy,
a raw-socket client (no client library), and the broker's CPU read from
/proc/<pid>/task/*/schedstat (nanoseconds, every thread), for ApiVersions and a one-record
Fetch, first back to back, then with a sleep between requests. Then the same comparison
without any broker or socket: this process encoding Fetch requests with canopy's codec,
timed with its own thread CPU clock (bench/README.md, "Where a hop's p99 comes from").

    .venv/bin/python bench/request_gap.py [--requests 3000] [--gaps 10,3.7]
"""
from __future__ import annotations

import argparse
import glob
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

# bench/peer_roundtrip.py (bench/ is sys.path[0] here) puts canopy's packages on sys.path
# (this checkout's, or PYTHONPATH's) and holds the broker with its records and the
# one-record Fetch this measures too.
import peer_roundtrip  # noqa: E402

from protocol.framing import encode_request  # noqa: E402
from protocol.messages import ApiKey  # noqa: E402

FETCH = peer_roundtrip.FETCH
REQUESTS = {
    "ApiVersions v3": encode_request(ApiKey.API_VERSIONS, 3, 1, "bench",
                                     {"client_software_name": "bench", "client_software_version": "1"}),
    "Fetch v12, one record": encode_request(ApiKey.FETCH, 12, 1, "bench", FETCH),
}


def run_cpu(pid: int) -> float:
    """Seconds on a CPU of every thread of pid (the scheduler's own count, not ticks)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            total += int(Path(f).read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass   # a worker thread that just ended
    return total / 1e9


def round_trip(sock: socket.socket, request: bytes) -> None:
    sock.sendall(request)
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    (size,) = struct.unpack(">i", head)
    while size:
        size -= len(sock.recv(size))


def broker_cpu_per_request(sock: socket.socket, pid: int, request: bytes, n: int, gap_s: float) -> float:
    c0 = run_cpu(pid)
    for _ in range(n):
        round_trip(sock, request)
        if gap_s:
            time.sleep(gap_s)
    return 1e6 * (run_cpu(pid) - c0) / n


def codec_cpu(n: int, gap_s: float) -> float:
    """Median thread CPU µs of encoding five Fetch requests, n times, sleeping gap_s before each."""
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.thread_time_ns()
        for _ in range(5):
            encode_request(ApiKey.FETCH, 12, 1, "bench", FETCH)
        out.append((time.thread_time_ns() - t0) / 1000)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="back-to-back requests per figure")
    ap.add_argument("--gapped", type=int, default=300, help="requests per figure with a sleep between")
    ap.add_argument("--gaps", default="10,3.7", help="sleeps between requests, ms")
    args = ap.parse_args()
    gaps = [float(g) / 1000 for g in args.gaps.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="canopy-request-gap-"))
    rows = []
    try:
        broker = peer_roundtrip.broker_with_records(workdir)
        try:
            sock = socket.create_connection(("127.0.0.1", broker.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for name, request in REQUESTS.items():
                for _ in range(300):   # connection, codecs and caches warm
                    round_trip(sock, request)
                row = [name, broker_cpu_per_request(sock, broker.pid, request, args.requests, 0)]
                row += [broker_cpu_per_request(sock, broker.pid, request, args.gapped, g) for g in gaps]
                rows.append(row)
            sock.close()
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows.append(["no broker: encode 5 Fetch requests", codec_cpu(args.requests // 5, 0)]
                + [codec_cpu(args.gapped, g) for g in gaps])
    head = ["back to back"] + [f"{g * 1000:g} ms apart" for g in gaps]
    print("CPU µs per request (last row: per 5 encodes, this process) | " + " | ".join(head))
    for name, tight, *gapped in rows:
        cells = [f"{tight:.0f}"] + [f"{v:.0f} ({v / tight:.1f}×)" for v in gapped]
        print(f"{name} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
