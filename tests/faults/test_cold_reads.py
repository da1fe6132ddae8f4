"""Issue 15, item 5: Fetch record bytes that are not in the page cache are read by a worker
thread (broker/cold_reads.py), so the event loop keeps serving every other connection.

The log is made cold for real (fsync, then POSIX_FADV_DONTNEED on its files, checked with
preadv2(RWF_NOWAIT): pagecache.py); a slow disk is made with strace's syscall fault
injection: every pread64 of the broker (only the cold-read workers issue it; the probes
are preadv2) is held at its entry until the tracer is stopped, so the tests decide when
a read finishes instead of hoping a disk is slow enough."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from protocol.messages import ApiKey
from tests.e2e.conftest import BrokerProcess, require_tool
from tests.e2e.rawclient import RawClient, create_topic, make_batch, produce

from .cluster import wait_for
from .history import iter_all_records
from .pagecache import drop_partition as drop
from .pagecache import evict_partition as evict

pytestmark = pytest.mark.timeout(300)

PREAD64 = {"x86_64": 17, "aarch64": 67}[os.uname().machine]


def values(n: int, seed: int) -> list[bytes]:
    """n distinct 10 kB record values (random bytes: a wrong region cannot look right)."""
    return [seed.to_bytes(2, "big") + i.to_bytes(4, "big") + os.urandom(10_000 - 6) for i in range(n)]


def fill(client: RawClient, topic: str, batches: int, seed: int) -> list[bytes]:
    out = []
    for b in range(batches):
        vals = values(40, seed * 1000 + b)
        assert produce(client, topic, make_batch(vals))["error_code"] == 0
        out += vals
    return out


def fetch_request(topic: str, offset: int) -> dict:
    return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 64 << 20}]}]}


def fetched_values(response: dict) -> list[bytes]:
    p = response["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return [r.value for r in iter_all_records(bytes(p["records"]))]


def earliest_offset(client: RawClient, topic: str) -> int:
    r = client.request(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -2}]}]})
    return r["topics"][0]["partitions"][0]["offset"]


class HeldReads:
    """strace on every thread of the broker, holding each pread64 at its entry until
    release() (detaching lets the held syscalls run)."""

    def __init__(self, pid: int, out: Path):
        self.pid = pid
        strace = require_tool("strace", "Debian package strace")
        self.proc = subprocess.Popen([strace, "-f", "-qq", "-o", str(out), "-e", "trace=pread64",
                                      "-e", "inject=pread64:delay_enter=600s", "-p", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._attached, "strace attached to every thread of the broker")

    def _tasks(self) -> list[Path]:
        return list(Path(f"/proc/{self.pid}/task").iterdir())

    def _attached(self) -> bool:
        for t in self._tasks():
            status = (t / "status").read_text()
            tracer = next(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:"))
            if int(tracer) != self.proc.pid:
                return False
        return True

    def held(self) -> int:
        """Threads stopped at a held pread64."""
        n = 0
        for t in self._tasks():
            try:
                state = (t / "stat").read_text().rsplit(") ", 1)[1].split()[0]
                call = (t / "syscall").read_text().split()[0]
            except (OSError, IndexError):
                continue
            if state == "t" and call == str(PREAD64):
                n += 1
        return n

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def deleted_segments_open(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.endswith(".log (deleted)"):
            out.append(target)
    return out


class HeldColdReads:
    """A broker whose cold-read workers a test holds: ``held_fetch`` sends a Fetch on a
    connection of its own and returns it once a worker's pread64 is held (strace attached
    at the first call, HeldReads). Leaving the block releases the held reads, then stops
    the broker."""

    def __init__(self, tmp_path: Path, extra_args=()):
        self.tmp_path = tmp_path
        self.broker = BrokerProcess(tmp_path / "data", extra_args=extra_args).start()
        self.reads: HeldReads | None = None

    def held_fetch(self, topic: str, offset: int) -> RawClient:
        if self.reads is None:
            self.reads = HeldReads(self.broker.proc.pid, self.tmp_path / "strace.out")
        client = RawClient(self.broker.bootstrap)
        client.send_only(ApiKey.FETCH, 12, fetch_request(topic, offset))
        wait_for(lambda: self.reads.held() >= 1, "a cold-read worker held in pread64")
        return client

    def release(self) -> None:
        self.reads.release()

    def __enter__(self) -> "HeldColdReads":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.reads is not None:
                self.reads.release()
        finally:
            self.broker.stop()


def answer_incomplete(client: RawClient) -> bool:
    """The response frame has not fully arrived (its header may have: canopy sends the
    bytes before the records as soon as it has them)."""
    timeout = client.sock.gettimeout()
    client.sock.settimeout(0)   # with a timeout set, recv would wait for the first byte
    try:
        data = client.sock.recv(256 << 20, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        client.sock.settimeout(timeout)
    return len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big")


def test_consumer_reads_a_cold_log_byte_for_byte(tmp_path):
    """A confluent-kafka consumer catching up on a log that is not in the page cache (six
    segments, fetches spanning segment and 4 MiB chunk boundaries) gets every record as
    produced."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        c = RawClient(b.bootstrap)
        create_topic(c, "cold", {"segment.bytes": str(3 << 20), "retention.ms": "-1"})
        produced = fill(c, "cold", 40, seed=1)
        c.close()
        evict(tmp_path / "data" / "topics" / "cold" / "0")
        consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "cold-reader",
                             "enable.auto.commit": False, "auto.offset.reset": "error",
                             "fetch.max.bytes": 20 << 20, "max.partition.fetch.bytes": 9 << 20})
        try:
            consumer.assign([TopicPartition("cold", 0, 0)])
            got: list[bytes] = []
            wait_for(lambda: got.extend(m.value() for m in consumer.consume(1000, 1) if not m.error())
                     or len(got) >= len(produced), "the whole cold log read back", timeout=120)
        finally:
            consumer.close()
        assert len(got) == len(produced)
        assert got == produced
    finally:
        b.stop()


def test_other_connections_are_served_while_a_cold_read_waits_for_the_disk(tmp_path):
    """While a worker thread's read of a cold log is held, other connections produce and
    fetch (a cached partition, and a second cold fetch that queues for a worker of its
    own) and the held fetch has sent nothing; once the read goes through, its response is
    the log as produced."""
    with HeldColdReads(tmp_path) as h:
        c = RawClient(h.broker.bootstrap)
        create_topic(c, "cold", {"segment.bytes": str(2 << 20), "retention.ms": "-1"})
        create_topic(c, "hot", {"retention.ms": "-1"})
        produced = fill(c, "cold", 20, seed=2)
        evict(tmp_path / "data" / "topics" / "cold" / "0")
        slow = h.held_fetch("cold", 0)
        slow2 = h.held_fetch("cold", 200)   # queues for a worker of its own
        # Everything else goes on: a produce and a fetch of a cached partition, each
        # answered within RawClient's 10 s, which a blocked event loop could not do.
        hot = fill(c, "hot", 3, seed=3)
        assert fetched_values(c.request(ApiKey.FETCH, 12, fetch_request("hot", 0))) == hot
        assert fill(c, "hot", 1, seed=4)
        assert answer_incomplete(slow) and answer_incomplete(slow2)
        h.release()
        assert fetched_values(slow.receive(timeout=120)) == produced
        assert fetched_values(slow2.receive(timeout=120)) == produced[200:]
        for client in (c, slow, slow2):
            client.close()
        assert h.broker.proc.poll() is None


def test_a_small_fetch_of_a_cold_log_is_read_by_a_worker_too(tmp_path):
    """A response of a few KiB is copied into one write (server.py, SMALL_RESPONSE_COPY):
    its records are read on the loop only when they are in the page cache; from a cold
    log a worker thread reads them, held here while the loop serves others."""
    with HeldColdReads(tmp_path) as h:
        c = RawClient(h.broker.bootstrap)
        create_topic(c, "cold", {"retention.ms": "-1"})
        create_topic(c, "hot", {"retention.ms": "-1"})
        produced = []
        for i in range(8):
            vals = [b"small-%d-%d" % (i, j) + os.urandom(200) for j in range(3)]
            assert produce(c, "cold", make_batch(vals))["error_code"] == 0
            produced += vals
        evict(tmp_path / "data" / "topics" / "cold" / "0")
        time.sleep(0.5)   # the check's read-ahead has read the whole 6 KiB log back in
        drop(tmp_path / "data" / "topics" / "cold" / "0")
        slow = h.held_fetch("cold", 0)
        hot = fill(c, "hot", 1, seed=5)
        assert fetched_values(c.request(ApiKey.FETCH, 12, fetch_request("hot", 0))) == hot
        assert answer_incomplete(slow)
        h.release()
        assert fetched_values(slow.receive(timeout=120)) == produced
        # Cached now: the same answer again, this time copied into one write.
        assert fetched_values(slow.request(ApiKey.FETCH, 12, fetch_request("cold", 0))) == produced
        for client in (c, slow):
            client.close()
        assert h.broker.proc.poll() is None


def test_segment_deleted_by_retention_during_a_cold_read(tmp_path):
    """Retention deletes the segments a held cold read is reading: they are unlinked at
    once but stay open (the fetch pins them), the fetch still answers exactly the bytes it
    was given, and the files are closed when it has been sent."""
    config = tmp_path / "canopy.toml"
    config.write_text("retention-check-interval-ms = 100\n")
    part = tmp_path / "data" / "topics" / "cold" / "0"
    with HeldColdReads(tmp_path, extra_args=["--config", str(config)]) as h:
        b = h.broker
        c = RawClient(b.bootstrap)
        create_topic(c, "cold", {"segment.bytes": str(2 << 20), "retention.ms": "-1",
                                 "retention.bytes": str(12 << 20)})
        produced = fill(c, "cold", 20, seed=5)
        segments = sorted(part.glob("*.log"))
        evict(part)
        slow = h.held_fetch("cold", 0)
        # More data: the log outgrows retention.bytes and its oldest segments go.
        more = fill(c, "cold", 20, seed=6)
        start = wait_for(lambda: earliest_offset(c, "cold"), "retention advanced the log start offset")
        gone = [f for f in segments if int(f.stem) < start]
        assert gone and not any(f.exists() for f in gone)
        assert deleted_segments_open(b.proc.pid), "the held fetch's segments were closed under it"
        assert answer_incomplete(slow)
        h.release()
        assert fetched_values(slow.receive(timeout=120)) == produced
        wait_for(lambda: not deleted_segments_open(b.proc.pid), "the deleted segments closed after the fetch")
        after = fetched_values(c.request(ApiKey.FETCH, 12, fetch_request("cold", start)))
        assert after and after == (produced + more)[-len(after):] and len(after) < len(produced + more)
        for client in (c, slow):
            client.close()
        assert b.proc.poll() is None
