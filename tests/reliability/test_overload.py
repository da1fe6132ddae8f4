"""Overload: 2 000 idle connections, 200 long-polling consumers, and a consumer that
stops reading mid-fetch. The broker's memory stays bounded, everyone else is served,
and the stalled connection is dropped once it has accepted nothing for the send timeout
(CANOPY_SEND_TIMEOUT_MS, 2 s here; 30 s by default)."""
from __future__ import annotations

import resource
import socket
import struct
import time

import pytest

from protocol.framing import encode_request
from protocol.messages import ApiKey
from tests.e2e.rawclient import create_topic, make_batch, produce

from .conftest import BrokerProcess, scale
from .helpers import fetch_once, open_fds, record_figures, rss_kib, wait_for_listener

IDLE = 2000
POLLERS = 200
pytestmark = pytest.mark.timeout(300)


def _fetch_frame(corr: int, topic: str, offset: int, max_wait_ms: int, max_bytes: int) -> bytes:
    return encode_request(ApiKey.FETCH, 11, corr, "overload", {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": 0, "fetch_offset": offset, "partition_max_bytes": max_bytes,
            "log_start_offset": -1, "current_leader_epoch": -1}]}],
        "forgotten_topics_data": [], "rack_id": ""})


def _roundtrip_ms(bootstrap: str, topic: str) -> float:
    c = wait_for_listener(bootstrap)
    t = time.monotonic()
    r = produce(c, topic, make_batch([b"ping"]), acks=1)
    assert r["error_code"] == 0
    p = fetch_once(c, topic, 0, r["base_offset"])
    assert p["error_code"] == 0 and p["records"]
    c.close()
    return (time.monotonic() - t) * 1000


@pytest.fixture
def nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, IDLE + POLLERS + 1000)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    assert want >= IDLE + POLLERS + 200, f"RLIMIT_NOFILE hard limit {hard} is too low"
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_connections_long_polls_and_a_stalled_reader(tmp_path, nofile):
    b = BrokerProcess(tmp_path / "data", env={"CANOPY_SEND_TIMEOUT_MS": "2000"}).start()
    held: list[socket.socket] = []
    try:
        c = wait_for_listener(b.bootstrap)
        create_topic(c, "ov")
        create_topic(c, "big")
        chunk = make_batch([b"z" * 1000] * 900)  # ~0.9 MB per batch
        for _ in range(40):
            assert produce(c, "big", chunk, acks=1)["error_code"] == 0
        c.close()
        time.sleep(0.5)
        rss_start, fds_start = rss_kib(b.proc.pid), open_fds(b.proc.pid)

        # 2 000 idle connections (half have spoken once, half never did)
        for i in range(IDLE):
            s = socket.create_connection((b.host, b.port))
            if i % 2:
                s.sendall(encode_request(ApiKey.API_VERSIONS, 3, 1, "idle",
                                         {"client_software_name": "i", "client_software_version": "1"}))
            held.append(s)
        for s in held[1::2]:
            s.settimeout(10)
            assert s.recv(4)
        time.sleep(6)  # past the idle release of receive buffers
        rss_idle = rss_kib(b.proc.pid)
        rt_idle = _roundtrip_ms(b.bootstrap, "ov")
        assert rt_idle < 2000, f"a client waited {rt_idle:.0f} ms behind 2000 idle connections"
        assert rss_idle - rss_start < 150 * 1024, f"2000 idle connections cost {rss_idle - rss_start} KiB"

        # 200 consumers long-polling at the log end; one append wakes them all
        c = wait_for_listener(b.bootstrap)
        end = produce(c, "ov", make_batch([b"before"]), acks=1)["base_offset"] + 1
        pollers = []
        for i in range(POLLERS):
            s = socket.create_connection((b.host, b.port))
            s.sendall(_fetch_frame(i, "ov", end, 20_000, 1 << 20))
            pollers.append(s)
        time.sleep(1)
        rss_poll = rss_kib(b.proc.pid)
        # a stalled reader: asks for 36 MB and reads nothing, with a small receive buffer,
        # and keeps pipelining more fetches behind it
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((b.host, b.port))
        for i in range(200):
            stalled.sendall(_fetch_frame(i, "big", 0, 0, 64 << 20))
        t0 = time.monotonic()
        assert produce(c, "ov", make_batch([b"wake"]), acks=1)["error_code"] == 0
        for s in pollers:
            s.settimeout(10)
            head = s.recv(4)
            assert len(head) == 4
        woke_ms = (time.monotonic() - t0) * 1000
        assert woke_ms < 5000, f"200 long polls took {woke_ms:.0f} ms to wake"
        rt_stalled = _roundtrip_ms(b.bootstrap, "ov")
        assert rt_stalled < 2000
        # the stalled connection is dropped after the send timeout
        deadline = time.monotonic() + 20
        while "peer read nothing" not in b.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        dropped_after = time.monotonic() - t0
        assert "peer read nothing" in b.log_text(), "stalled reader was never cut off"
        stalled.settimeout(10)
        got = 0
        try:
            while True:
                d = stalled.recv(1 << 20)
                if not d:
                    break
                got += len(d)
        except (ConnectionResetError, socket.timeout):
            pass
        assert got < 36_000_000, "the stalled reader was sent the whole response anyway"
        rss_stall = rss_kib(b.proc.pid)
        c.close()
        assert rss_stall - rss_start < 200 * 1024, f"RSS grew {rss_stall - rss_start} KiB"
        assert b.proc.poll() is None
    finally:
        for s in held:
            s.close()
        b.stop()
    record_figures("overload", idle_connections=IDLE, long_pollers=POLLERS,
                   rss_kib_start=rss_start, rss_kib_idle=rss_idle, rss_kib_polling=rss_poll,
                   rss_kib_after_stall=rss_stall, fds_start=fds_start,
                   roundtrip_ms_with_idle=round(rt_idle, 1), long_polls_woken_ms=round(woke_ms),
                   stalled_reader_dropped_after_s=round(dropped_after, 1))
