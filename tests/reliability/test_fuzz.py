"""Hostile input: mutated and random frames across every API key and version.

The corpus is real client traffic (kafka-python producing, consuming in a group,
committing and using the admin client, recorded by a proxy the broker advertises) plus
one default-valued request for every (API key, version) canopy serves. Each fuzz frame is
a mutation of a corpus frame (bit flips, boundary integers, truncation, garbage appended
or inserted, another key or version, splices, lying size prefixes up to 2 GiB) sent to a
live broker, followed by an ApiVersions probe on the same connection: the broker must
answer the probe (so it neither crashed nor hung, and answered in order) or close the
connection. Its memory must stay bounded.

`make test`: 4 000 mutated frames + 300 hypothesis examples; `make reliability`:
100 000 mutated frames + 3 000 hypothesis examples.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.handlers import HANDLERS
from protocol.framing import encode_request
from protocol.messages import ApiKey

from .conftest import BrokerProcess, free_port, scale
from .helpers import record_figures, rss_kib, wait_for_listener

FRAMES = scale(4_000, 100_000)
HYPOTHESIS_EXAMPLES = scale(300, 3_000)
# Requests that may legitimately block (long-poll Fetch, JoinGroup/SyncGroup waiting for
# a rebalance): a probe that does not come back quickly is not a hang for these.
MAY_BLOCK = {ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}
PROBE_ID = 0x7A7A7A7A
pytestmark = pytest.mark.timeout(300 + FRAMES // 100)


def _probe() -> bytes:
    return encode_request(ApiKey.API_VERSIONS, 3, PROBE_ID, "probe",
                          {"client_software_name": "probe", "client_software_version": "1"})


PROBE = _probe()


class Recorder:
    """A TCP proxy that records every client->broker frame."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.port = free_port()
        self.frames: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", self.port))
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, False), daemon=True).start()

    def _pump(self, src, dst, record):
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                if record:
                    buf += data
                    while len(buf) >= 4:
                        (n,) = struct.unpack_from(">i", buf)
                        if len(buf) < 4 + n:
                            break
                        self.frames.append(buf[4:4 + n])
                        buf = buf[4 + n:]
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.sock.close()


def _capture_real_traffic(tmp_path) -> list[bytes]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    rec_port = free_port()
    b = BrokerProcess(tmp_path / "capture", extra_args=["--advertise", f"127.0.0.1:{rec_port}"]).start()
    rec = Recorder(b.port)
    rec.sock.close()
    rec.port = rec_port
    rec.sock = socket.create_server(("127.0.0.1", rec_port))
    threading.Thread(target=rec._accept, daemon=True).start()
    boot = f"127.0.0.1:{rec_port}"
    try:
        admin = KafkaAdminClient(bootstrap_servers=boot)
        admin.create_topics([NewTopic("fz", 2, 1)])
        admin.list_groups() if hasattr(admin, "list_groups") else None
        p = KafkaProducer(bootstrap_servers=boot, compression_type="gzip", linger_ms=5)
        for i in range(30):
            p.send("fz", key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"1")])
        p.flush()
        p.close()
        c = KafkaConsumer("fz", bootstrap_servers=boot, group_id="fzg", auto_offset_reset="earliest",
                          consumer_timeout_ms=3000)
        n = sum(1 for _ in c)
        c.commit()
        c.close()
        assert n == 30
        admin.delete_topics(["fz"])
        admin.close()
    finally:
        rec.close()
        b.stop()
    return list(rec.frames)


def _default_frames() -> list[bytes]:
    out = []
    for key, handler in sorted(HANDLERS.items()):
        for v in range(handler.MIN_VERSION, handler.MAX_VERSION + 1):
            try:
                out.append(encode_request(key, v, 1, "fuzz", {})[4:])
            except Exception:
                pass
    return out


BOUNDARY = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000]


def mutate(rng: random.Random, frame: bytes, corpus: list[bytes]) -> tuple[bytes, int]:
    """Returns (bytes to send including the size prefix, declared size)."""
    f = bytearray(frame)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
        op = rng.randrange(9)
        if op == 0 and f:  # bit flip
            i = rng.randrange(len(f))
            f[i] ^= 1 << rng.randrange(8)
        elif op == 1 and len(f) >= 2:  # boundary int16/int32 somewhere
            width = rng.choice((1, 2, 4))
            i = rng.randrange(max(1, len(f) - width + 1))
            val = rng.choice(BOUNDARY) & ((1 << (8 * width)) - 1)
            f[i:i + width] = val.to_bytes(width, "big")
        elif op == 2:  # truncate
            del f[rng.randrange(len(f) + 1):]
        elif op == 3:  # append garbage
            f += rng.randbytes(rng.randrange(1, 64))
        elif op == 4 and f:  # insert garbage
            i = rng.randrange(len(f))
            f[i:i] = rng.randbytes(rng.randrange(1, 16))
        elif op == 5 and len(f) >= 4:  # another api version (often out of range)
            struct.pack_into(">h", f, 2, rng.choice((rng.randrange(-2, 20), 32767, -32768)))
        elif op == 6 and len(f) >= 2:  # another api key
            struct.pack_into(">h", f, 0, rng.choice((rng.randrange(-1, 80), 32767)))
        elif op == 7:  # splice with another frame
            other = rng.choice(corpus)
            f = f[:rng.randrange(len(f) + 1)] + other[rng.randrange(len(other) + 1):]
        elif op == 8 and f:  # delete a range
            i = rng.randrange(len(f))
            del f[i:i + rng.randrange(1, 16)]
    declared = len(f)
    r = rng.random()
    if r < 0.02:
        declared = rng.choice((0x7FFFFFFF, 0x80000000 - 4, -1, -0x80000000, 200 << 20))
    elif r < 0.05:
        declared = len(f) + rng.randrange(1, 1000)  # lies upward: the broker waits for more
    elif r < 0.08 and len(f) > 0:
        declared = rng.randrange(len(f))  # lies downward: the rest parses as the next frame
    return struct.pack(">i", declared if declared < 0x80000000 else declared - (1 << 32)) + bytes(f), declared


def _recv_until_probe(sock: socket.socket, timeout: float) -> str:
    """Read frames until the probe's response: 'answered', 'closed' or 'timeout'."""
    sock.settimeout(timeout)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            while len(buf) >= 8:
                (n,) = struct.unpack_from(">i", buf)
                if len(buf) < 4 + n:
                    break
                (corr,) = struct.unpack_from(">i", buf, 4)
                buf = buf[4 + n:]
                if corr == PROBE_ID:
                    return "answered"
            if time.monotonic() > deadline:
                return "timeout"
            data = sock.recv(1 << 20)
            if not data:
                return "closed"
            buf += data
    except socket.timeout:
        return "timeout"
    except (ConnectionResetError, BrokenPipeError):
        return "closed"


def _alive(b: BrokerProcess) -> None:
    assert b.proc.poll() is None, "broker died:\n" + b.log_text()
    c = wait_for_listener(b.bootstrap, timeout=10)
    c.close()


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    b = BrokerProcess(tmp / "data", extra_args=["--log-level", "error"]).start()
    yield b, tmp
    b.stop()


def test_mutated_client_traffic_never_crashes_or_hangs(fuzz_broker):
    b, tmp = fuzz_broker
    corpus = _capture_real_traffic(tmp)
    captured = len(corpus)
    assert captured > 20, "recorded too little client traffic"
    corpus += _default_frames()
    # topics the mutated requests can find: captured traffic names 'fz'
    c = wait_for_listener(b.bootstrap)
    from tests.e2e.rawclient import create_topic, make_batch, produce
    create_topic(c, "fz")
    produce(c, "fz", make_batch([b"x"] * 10))
    c.close()
    rng = random.Random(6)
    rss0 = rss_kib(b.proc.pid)
    outcomes = {"answered": 0, "closed": 0, "timeout-blocking-api": 0}
    keys = set()
    sock = None
    for i in range(FRAMES):
        frame = rng.choice(corpus)
        data, declared = mutate(rng, frame, corpus)
        key = struct.unpack_from(">h", data, 4)[0] if len(data) >= 6 else -1
        keys.add(key)
        if sock is None:
            sock = socket.create_connection((b.host, b.port))
        try:
            sock.sendall(data)
            if declared != len(data) - 4:
                # a lying size prefix: the broker either refuses it or waits for bytes
                # that never come; end our side and expect it to close.
                sock.shutdown(socket.SHUT_WR)
                result = _recv_until_probe(sock, 10)
                assert result != "timeout", f"frame {i}: no close after EOF (declared {declared})"
                outcomes["closed"] += 1
                sock.close()
                sock = None
                continue
            sock.sendall(PROBE)
        except (BrokenPipeError, ConnectionResetError):
            outcomes["closed"] += 1
            sock.close()
            sock = None
            continue
        base_key = struct.unpack_from(">h", frame, 0)[0]
        result = _recv_until_probe(sock, 0.5 if base_key in MAY_BLOCK or key in MAY_BLOCK else 15)
        if result == "timeout":
            assert base_key in MAY_BLOCK or key in MAY_BLOCK, \
                f"frame {i} (key {key}): neither answered nor closed in 15 s: {data[:80]!r}"
            result = "timeout-blocking-api"
        outcomes[result] += 1
        if result != "answered":
            sock.close()
            sock = None
        if i % 2000 == 1999:
            _alive(b)
    if sock:
        sock.close()
    _alive(b)
    rss1 = rss_kib(b.proc.pid)
    assert rss1 - rss0 < 300 * 1024, f"broker RSS grew from {rss0} to {rss1} KiB"
    record_figures("fuzz_mutation", frames=FRAMES, corpus_captured=captured, corpus_total=len(corpus),
                   api_keys_sent=len(keys), outcomes=outcomes, rss_kib_before=rss0, rss_kib_after=rss1,
                   crashes=0, hangs=0)


def test_declared_2gib_frame_is_not_allocated(fuzz_broker):
    b, _ = fuzz_broker
    rss0 = rss_kib(b.proc.pid)
    socks = []
    for declared in (0x7FFFFFFF, 100 * 1024 * 1024, 99 * 1024 * 1024):
        for _ in range(20):
            s = socket.create_connection((b.host, b.port))
            s.sendall(struct.pack(">i", declared) + b"\0\x12\0\x03" + b"x" * 1000)
            socks.append(s)
    time.sleep(1)
    rss1 = rss_kib(b.proc.pid)
    assert rss1 - rss0 < 100 * 1024, f"declared-but-unsent frames cost {rss1 - rss0} KiB"
    for s in socks:
        s.close()
    _alive(b)


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(sorted(HANDLERS) + [-1, 99, 32767]), version=st.integers(-1, 20),
       body=st.binary(max_size=300), correlation=st.integers(-2**31, 2**31 - 1))
def test_hypothesis_random_bodies_for_every_key_and_version(fuzz_broker, key, version, body, correlation):
    b, _ = fuzz_broker
    frame = struct.pack(">hhi", key, version, correlation) + struct.pack(">h", 4) + b"hyp!" + body
    with socket.create_connection((b.host, b.port)) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame + PROBE)
        result = _recv_until_probe(s, 0.5 if key in MAY_BLOCK else 15)
        assert result != "timeout" or key in MAY_BLOCK, f"no answer and no close for key {key} v{version}"
    assert b.proc.poll() is None, b.log_text()


def test_unencodable_response_closes_only_that_connection(fuzz_broker):
    """Found by the fuzzer: Metadata v10/v11 naming a topic with a null name made the
    handler build a response its schema cannot encode, and the exception escaped the
    connection task and stopped the whole broker. Now only the connection closes."""
    import uuid

    from tests.e2e.rawclient import RawClient
    b, _ = fuzz_broker
    for v in (10, 11):
        c = RawClient(b.bootstrap)
        c.send_raw(encode_request(ApiKey.METADATA, v, 5, "null-name", {
            "topics": [{"topic_id": uuid.UUID(int=0), "name": None}], "allow_auto_topic_creation": True}))
        c.recv_frame()  # an answer or a close, either is fine
        c.close()
    _alive(b)
