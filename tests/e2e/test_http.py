"""The broker's HTTP port (issue 13): the NDJSON tail of a partition checked against
kafka-python's offsets_for_times + consume on compressed batches, follow mode, a reader
that stops reading, bad requests, and `--log-format json`. Real `canopy serve` processes,
real clients."""
from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from .conftest import CANOPY, free_port


@pytest.fixture
def http_broker(broker_factory):
    port = free_port()
    b = broker_factory(extra_args=["--http-listen", f"127.0.0.1:{port}", "--log-format", "json"],
                       env={"CANOPY_SEND_TIMEOUT_MS": "3000"})
    b.http = f"127.0.0.1:{port}"
    return b


def get(b, path: str, timeout: float = 30) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://{b.http}{path}", timeout=timeout) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def ndjson(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.decode().splitlines()]


def iso(ms: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_tail_from_a_time_is_what_offsets_for_times_and_a_consumer_give(http_broker, codec):
    topic = f"tail-{codec}"
    base = 1_760_000_000_000
    p = KafkaProducer(bootstrap_servers=http_broker.bootstrap, compression_type=codec, linger_ms=20, batch_size=4096)
    for i in range(600):
        # several records per millisecond and some out of order: the time lookup must be
        # exact to the record, not to the batch
        ts = base + (i // 3) * 7 + (5 if i % 11 == 0 else 0)
        key = None if i % 5 == 0 else b"k%d" % i
        value = bytes([0xff, i % 256]) if i % 7 == 0 else ("v%d é" % i).encode()
        p.send(topic, key=key, value=value, timestamp_ms=ts, headers=[("h", b"%d" % i), ("bin", b"\x00\xfe")])
        if i % 97 == 0:
            p.flush()
    p.flush()
    p.close()

    tp = TopicPartition(topic, 0)
    for at in (base + 3, base + 7 * 77 + 2, base + 7 * 150, base + 7 * 1000):
        c = KafkaConsumer(bootstrap_servers=http_broker.bootstrap, enable_auto_commit=False,
                          consumer_timeout_ms=2000)
        c.assign([tp])
        found = c.offsets_for_times({tp: at})[tp]
        expected = []
        if found is not None:
            c.seek(tp, found.offset)
            for m in c:
                expected.append({"offset": m.offset, "timestamp": m.timestamp, "key": m.key, "value": m.value,
                                 "headers": [(k, v) for k, v in m.headers]})
        c.close()
        status, ctype, body = get(http_broker, f"/topics/{topic}/partitions/0/records?from_time={iso(at)}")
        assert status == 200 and ctype == "application/x-ndjson"
        got = ndjson(body)
        assert [decode(r) for r in got] == expected, at
        if at == base + 7 * 1000:
            assert got == []   # later than every record: nothing, as offsets_for_times says None
        else:
            assert got, at
    # an RFC 3339 time with an offset names the same instant
    at = base + 7 * 77 + 2
    plus2 = (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=at)).astimezone(
        timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")
    _, _, a = get(http_broker, f"/topics/{topic}/partitions/0/records?from_time={urllib.request.quote(plus2)}")
    _, _, b = get(http_broker, f"/topics/{topic}/partitions/0/records?from_time={iso(at)}")
    assert a == b and a
    # max_records and from=OFFSET
    _, _, body = get(http_broker, f"/topics/{topic}/partitions/0/records?from=123&max_records=5")
    assert [r["offset"] for r in ndjson(body)] == [123, 124, 125, 126, 127]


def decode(r: dict) -> dict:
    import base64

    def field(d, name):
        if name + "_base64" in d:
            return base64.b64decode(d[name + "_base64"])
        v = d[name]
        return None if v is None else v.encode()
    return {"offset": r["offset"], "timestamp": r["timestamp"], "key": field(r, "key"), "value": field(r, "value"),
            "headers": [(h["key"], field(h, "value")) for h in r["headers"]]}


def test_follow_delivers_a_record_produced_after_the_request(http_broker):
    p = KafkaProducer(bootstrap_servers=http_broker.bootstrap)
    p.send("live", value=b"before").get(30)
    got: list = []

    def reader():
        with urllib.request.urlopen(f"http://{http_broker.http}/topics/live/partitions/0/records"
                                    "?from=latest&follow=1&max_records=2", timeout=60) as r:
            for line in r:
                got.append((time.monotonic(), json.loads(line)))

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(1.0)
    assert got == []   # nothing new yet: the request waits
    sent_at = time.monotonic()
    p.send("live", value=b"after-1").get(30)
    p.send("live", value=b"after-2").get(30)
    p.close()
    t.join(60)
    assert not t.is_alive()
    assert [r["value"] for _, r in got] == ["after-1", "after-2"]
    assert [r["offset"] for _, r in got] == [1, 2]
    assert got[0][0] - sent_at < 10   # woken by the append (a long poll), not by a timer of its own


def rss_anon_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


def test_a_reader_that_stops_reading_is_dropped_and_costs_no_memory(http_broker):
    p = KafkaProducer(bootstrap_servers=http_broker.bootstrap, max_request_size=2 << 20, linger_ms=5)
    value = b"z" * (256 * 1024)
    for _ in range(8):
        p.send("big", value=value)
    p.flush()
    s = socket.create_connection(("127.0.0.1", int(http_broker.http.split(":")[1])))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.sendall(b"GET /topics/big/partitions/0/records?from=0&follow=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(1.0)
    before = rss_anon_kb(http_broker.proc.pid)
    # 100 MB more while the reader reads nothing: none of it may pile up in the broker
    for _ in range(400):
        p.send("big", value=value)
    p.flush()
    p.close()
    time.sleep(2.0)
    grown_mb = (rss_anon_kb(http_broker.proc.pid) - before) / 1024
    assert grown_mb < 40, f"broker grew {grown_mb:.0f} MB for a reader that reads nothing"
    # The reader stalled longer than the send timeout (3 s here): the broker dropped it,
    # so a follow=1 stream, which never ends by itself, ends.
    time.sleep(6.0)
    s.settimeout(30)
    received = 0
    try:
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            received += len(chunk)
    except ConnectionResetError:
        pass
    finally:
        s.close()
    assert received < 400 * len(value), received
    # the broker still answers
    status, _, _ = get(http_broker, "/topics/big/partitions/0/records?from=0&max_records=1")
    assert status == 200


@pytest.mark.parametrize("path,status,error", [
    ("/topics/nope/partitions/0/records", 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("/topics/bad/partitions/7/records", 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("/topics/bad/partitions/x/records", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/-1/records", 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("/topics/bad/partitions/0/records?from=-5", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?from=abc", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?from=999", 416, "OFFSET_OUT_OF_RANGE"),
    ("/topics/bad/partitions/0/records?from_time=yesterday", 400, "INVALID_TIMESTAMP"),
    ("/topics/bad/partitions/0/records?from_time=2026-13-45T99:00:00Z", 400, "INVALID_TIMESTAMP"),
    ("/topics/bad/partitions/0/records?from_time=1900-01-01T00:00:00Z", 400, "INVALID_TIMESTAMP"),
    ("/topics/bad/partitions/0/records?from=0&from_time=2026-01-01T00:00:00Z", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?max_records=0", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?max_bytes=lots", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?follow=maybe", 400, "INVALID_REQUEST"),
    ("/topics/bad/partitions/0/records?offset=3", 400, "INVALID_REQUEST"),
    ("/topics/bad/records", 404, "NOT_FOUND"),
    ("/nothing-here", 404, "NOT_FOUND"),
])
def test_bad_requests_get_a_4xx_json_error(http_broker, path, status, error):
    p = KafkaProducer(bootstrap_servers=http_broker.bootstrap)
    p.send("bad", value=b"one").get(30)
    p.close()
    got, ctype, body = get(http_broker, path)
    assert got == status, body
    assert ctype == "application/json"
    doc = json.loads(body)
    assert doc["error"] == error and doc["message"], doc
    assert b"Traceback" not in body
    log = http_broker.log_text()
    assert "Traceback" not in log


def test_post_is_refused_and_log_lines_are_json(http_broker):
    req = urllib.request.Request(f"http://{http_broker.http}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and json.loads(e.value.read())["error"] == "METHOD_NOT_ALLOWED"
    lines = [line for line in http_broker.log_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        doc = json.loads(line)
        assert {"ts", "level", "logger", "msg"} <= set(doc), doc
    assert any(json.loads(line)["logger"] == "canopy.http" for line in lines)


def test_busy_or_bad_http_listen_is_one_line_and_exit_2(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        for arg, message in ((f"127.0.0.1:{busy.getsockname()[1]}", "address already in use"),
                             ("nonsense", "http-listen must be HOST:PORT")):
            r = subprocess.run([str(CANOPY), "serve", "--data-dir", str(tmp_path / "d"), "--listen",
                                f"127.0.0.1:{free_port()}", "--http-listen", arg],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 2, r
            assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        busy.close()


def test_single_broker_metrics_per_partition_and_connection_failures(broker_factory):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    b = broker_factory(extra_args=["--http-listen", f"127.0.0.1:{port}", "--metrics-per-partition", "true",
                                   "--num-partitions", "3"])
    b.http = f"127.0.0.1:{port}"
    p = KafkaProducer(bootstrap_servers=b.bootstrap)
    for i in range(30):
        p.send("pp", value=b"v", partition=i % 3).get(30)
    p.close()
    # a client that sends a frame that is no Kafka request: one failure, one log line
    s = socket.create_connection(("127.0.0.1", b.port))
    s.sendall(b"\x00\x00\x00\x06" + b"\x7f\x7f\x00\x00\x00\x01")
    s.settimeout(10)
    assert s.recv(10) == b""
    s.close()

    def samples():
        _, _, body = get(b, "/metrics")
        out = {}
        for f in text_string_to_metric_families(body.decode()):
            for smp in f.samples:
                out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
        return out

    m = samples()
    for i in range(3):
        assert m[("kafka_server_brokertopicmetrics_messagesin_total", (("partition", str(i)), ("topic", "pp")))] == 10
        assert m[("kafka_log_log_logendoffset", (("partition", str(i)), ("topic", "pp")))] == 10
    assert m[("kafka_server_socketservermetrics_connection_failures_total", ())] == 1
    assert m[("kafka_controller_kafkacontroller_activecontrollercount", ())] == 1
    assert m[("kafka_network_requestmetrics_requests_total", (("request", "Produce"),))] == 30
    assert "closing connection" in b.log_text()
