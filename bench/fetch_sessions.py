"""KIP-227 fetch sessions: broker CPU of a Fetch over many partitions, full vs incremental.

    .venv/bin/python bench/fetch_sessions.py [--partitions 1000] [--fetches 300] [--rounds 3]

One canopy broker, one topic of N partitions. A fetcher (a follower or a consumer that
keeps up) reads all N at their log ends; between two of its Fetches one record is appended
to partition 0, so every Fetch has exactly one partition with news. The fetcher speaks the
protocol itself (canopy's codec on a plain socket; librdkafka and kafka-python never open
sessions, the Java client and canopy's own followers do):

* full: every Fetch names all N partitions (session_epoch -1), and the answer lists all N;
* session: a Fetch with epoch 0 opens a session, each later one names only partition 0
  (its offset moved), and the answer lists only partition 0.

Reported: broker CPU µs per Fetch (utime+stime of the broker process across the loop, the
one-record Produce included in both) and request/response bytes per Fetch, the two modes
alternated on the same broker in each round; the ratio is session/full.

    .venv/bin/python bench/fetch_sessions.py --replicated [--partitions 1000] [--records 300]

The followers' side: bench/replication.py's cluster (etcd, four brokers on 127.0.0.11-.14,
fan-out 2), one topic of N partitions over all four (leaders spread over the brokers), and
a producer sending records one at a time with acks=all to partition 0. Each round starts
two fresh clusters in turn: one whose brokers keep no fetch sessions
(max-incremental-fetch-session-cache-slots=0: every follower Fetch names and gets back all
its partitions, as before KIP-227 here) and one with sessions (the default). Reported: the
four brokers' CPU per record (utime+stime, from the first send to the last answer) and
the producer's records per second.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

# The repository root first, so `replication` is the package, not bench/replication.py
# (loaded below under its own name for --replicated); bench/ after it for its helpers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from confluent_kafka import Producer  # noqa: E402

from brokers import ROOT, load_module  # noqa: E402
from kafka_load import make_topic  # noqa: E402
from produce_ab import serve  # noqa: E402
from protocol.framing import encode_request, parse_response_header  # noqa: E402
from protocol.messages import ApiKey, api  # noqa: E402

FETCH_VERSION = 12
SLOTS_ENV = "CANOPY_MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS"


class Fetcher:
    def __init__(self, bootstrap: str):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0
        self.sent_bytes = self.received_bytes = 0

    def fetch(self, topic: str, offsets: dict[int, int], session_id: int, epoch: int) -> dict:
        self.correlation += 1
        frame = encode_request(ApiKey.FETCH, FETCH_VERSION, self.correlation, "bench-fetch-sessions", {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20,
            "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
            "topics": [{"topic": topic, "partitions": [
                {"partition": i, "fetch_offset": o, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                 "log_start_offset": -1, "last_fetched_epoch": -1} for i, o in offsets.items()]}] if offsets else [],
            "forgotten_topics_data": [], "rack_id": ""})
        self.sock.sendall(frame)
        self.sent_bytes += len(frame)
        (size,) = struct.unpack(">i", self._exact(4))
        body = self._exact(size)
        self.received_bytes += 4 + size
        _, skip = parse_response_header(body, ApiKey.FETCH, FETCH_VERSION)
        resp = api(ApiKey.FETCH).response.decode(body[skip:], FETCH_VERSION)
        assert resp["error_code"] == 0, resp
        return resp

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)


def listed(resp) -> dict[int, dict]:
    return {p["partition_index"]: p for t in resp["responses"] for p in t["partitions"]}


def one_mode(b, producer, topic: str, partitions: int, fetches: int, session: bool) -> tuple[float, float, float]:
    fetcher = Fetcher(b.bootstrap)
    offsets = {i: 0 for i in range(partitions)}
    # Start at every partition's end (partition 0 holds the earlier modes' records).
    opened = fetcher.fetch(topic, offsets, 0, 0 if session else -1)
    first = listed(opened)
    offsets = {i: first[i]["high_watermark"] for i in range(partitions)}
    sid, epoch = opened["session_id"], 1
    assert (sid > 0) == session, sid
    sent0, received0 = fetcher.sent_bytes, fetcher.received_bytes
    cpu0 = b.cpu()
    for _ in range(fetches):
        producer.produce(topic, b"x" * 100, partition=0)
        producer.flush()
        if session:
            resp = fetcher.fetch(topic, {0: offsets[0]}, sid, epoch)
            epoch += 1
        else:
            resp = fetcher.fetch(topic, offsets, 0, -1)
        got = listed(resp)
        offsets[0] = got[0]["high_watermark"]
        assert len(got[0]["records"]) > 0 and len(got) == (1 if session else partitions)
    cpu = b.cpu() - cpu0
    sent, received = fetcher.sent_bytes - sent0, fetcher.received_bytes - received0
    fetcher.sock.close()
    return cpu / fetches * 1e6, sent / fetches, received / fetches


def replicated_round(repl, partitions: int, records: int, slots: int) -> tuple[float, float]:
    """One fresh cluster whose brokers cache ``slots`` fetch sessions: (broker CPU µs per
    record, records per second) for one-at-a-time acks=all records to partition 0."""
    from confluent_kafka.admin import AdminClient, NewTopic

    os.environ[SLOTS_ENV] = str(slots)
    with tempfile.TemporaryDirectory(prefix="bench-fetch-sessions-") as tmp:
        cluster = repl.Cluster(Path(tmp))
        try:
            cluster.start()
            topic = f"sessions-{uuid.uuid4().hex[:6]}"
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.create_topics([NewTopic(topic, partitions, -1)], operation_timeout=60,
                                request_timeout=120)[topic].result(120)
            deadline = time.monotonic() + 120
            while True:   # every partition led, and partition 0's ISR = leader + its children
                md = admin.list_topics(topic, timeout=10).topics[topic]
                if len(md.partitions) == partitions and all(p.leader >= 0 for p in md.partitions.values()) \
                        and len(md.partitions[0].isrs) == 3:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{topic} never settled; see {tmp}/node*.log")
                time.sleep(0.5)
            producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "acks": "all",
                                 "enable.idempotence": False})
            for _ in range(20):   # warm up the producer's connection and the followers' fetchers
                producer.produce(topic, b"x" * 100, partition=0)
                producer.flush(30)
            # Let the followers finish making their partitions' files (a worker thread
            # after each topic change): all four brokers below 20 % CPU for a second.
            quiet_deadline, quiet = time.monotonic() + 120, 0
            while quiet < 2 and time.monotonic() < quiet_deadline:
                before = sum(cluster.cpu().values())
                time.sleep(0.5)
                quiet = quiet + 1 if sum(cluster.cpu().values()) - before < 0.4 else 0
            cpu0, t0 = sum(cluster.cpu().values()), time.perf_counter()
            for _ in range(records):
                producer.produce(topic, b"x" * 100, partition=0)
                producer.flush(30)
            elapsed = time.perf_counter() - t0
            cpu = sum(cluster.cpu().values()) - cpu0
        finally:
            cluster.stop()
            os.environ.pop(SLOTS_ENV, None)
    return cpu / records * 1e6, records / elapsed


def replicated(args) -> int:
    repl = load_module(ROOT / "bench" / "replication.py", "bench_replication")
    out: dict[str, list[tuple[float, float]]] = {"no sessions": [], "sessions": []}
    for r in range(args.rounds):
        modes = (("no sessions", 0), ("sessions", 1000))
        for mode, slots in (modes if r % 2 == 0 else modes[::-1]):
            us, rate = replicated_round(repl, args.partitions, args.records, slots)
            out[mode].append((us, rate))
            print(f"round {r + 1} {mode:11s}: {us:8.0f} broker CPU-µs per record (4 brokers), "
                  f"{rate:6.0f} records/s", flush=True)
    print(f"\n{args.partitions} partitions over 4 brokers, {args.records} acks=all records per cluster, "
          f"{args.rounds} rounds (load average {os.getloadavg()[0]:.1f})")
    print("| followers | broker CPU µs per record, median (range) | records/s, median (range) |")
    print("|---|---:|---:|")
    for mode, rows in out.items():
        us, rate = [u for u, _ in rows], [q for _, q in rows]
        print(f"| {mode} | {statistics.median(us):,.0f} ({min(us):,.0f}–{max(us):,.0f}) "
              f"| {statistics.median(rate):,.0f} ({min(rate):,.0f}–{max(rate):,.0f}) |")
    ratio = lambda i: statistics.median(r[i] for r in out["sessions"]) / statistics.median(r[i] for r in out["no sessions"])  # noqa: E731
    print(f"\nsessions/no sessions: CPU per record {ratio(0):.3f}, records/s {ratio(1):.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--fetches", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="full,session", help="for profiling one mode: session or full")
    ap.add_argument("--replicated", action="store_true", help="followers in a 4-broker cluster (see above)")
    ap.add_argument("--records", type=int, default=300, help="--replicated: acks=all records per cluster")
    args = ap.parse_args()
    if args.replicated:
        return replicated(args)
    out = {"full": [], "session": []}
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="bench-fetch-sessions-") as tmp:
        b = serve(ROOT, os.path.join(tmp, "data"), Path(tmp) / "canopy.log", "canopy")
        try:
            topic = f"sessions-{uuid.uuid4().hex[:6]}"
            make_topic(b, topic, args.partitions)
            producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": 1,
                                 "enable.idempotence": False})
            time.sleep(2)   # canopy makes the partitions' files in a worker thread after CreateTopics
            for r in range(args.rounds):
                modes = args.modes.split(",")
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    us, sent, received = one_mode(b, producer, topic, args.partitions, args.fetches,
                                                  mode == "session")
                    out[mode].append(us)
                    sizes[mode] = (sent, received)
                    print(f"round {r + 1} {mode:8s}: {us:8.0f} broker CPU-µs per Fetch, "
                          f"{sent:8.0f} B request, {received:8.0f} B response", flush=True)
        finally:
            b.stop()
    if not (out["full"] and out["session"]):
        return 0
    full, sess = statistics.median(out["full"]), statistics.median(out["session"])
    print(f"\n{args.partitions} partitions, {args.fetches} Fetches per mode, {args.rounds} rounds "
          f"(load average {os.getloadavg()[0]:.1f})")
    print("| mode | broker CPU µs per Fetch, median (range) | request B | response B |")
    print("|---|---:|---:|---:|")
    for mode in ("full", "session"):
        print(f"| {mode} | {statistics.median(out[mode]):,.0f} ({min(out[mode]):,.0f}–{max(out[mode]):,.0f}) "
              f"| {sizes[mode][0]:,.0f} | {sizes[mode][1]:,.0f} |")
    print(f"\nsession/full broker CPU per Fetch: {sess / full:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
