"""Pure parts of the HTTP port (issue 13): the request-path counters, the error-code walk,
time lag from the timestamp index, the consumer-protocol assignment decoder, time
parsing for the tail, JSON log lines, the HTTP address a broker registers."""
from __future__ import annotations

import json
import logging
import struct

import pytest

from broker.config import ConfigError, load_config
from broker.http.tail import BadRequest, parse_time
from broker.http.views import decode_assignment
from broker.logformat import JsonFormatter
from broker.stats import Histogram, RequestStats
from protocol.records import build_batch
from protocol.schema import EncodedArray
from storage import Log, LogConfig


def test_histogram_buckets_are_upper_bounds_inclusive():
    h = Histogram((0.001, 0.01))
    for v in (0.0005, 0.001, 0.002, 0.5):
        h.observe(v)
    assert h.counts == [2, 1, 1] and h.count == 4 and h.sum == pytest.approx(0.5035)


def test_errors_counted_at_every_level_of_a_response():
    s = RequestStats()
    s.record(0, 0.001, {"error_code": 0, "responses": [
        {"name": "t", "partition_responses": [{"index": 0, "error_code": 6}, {"index": 1, "error_code": 6},
                                              {"index": 2, "error_code": 0, "records": b"\x00" * 10}]}]})
    s.record(0, 0.001, None)   # acks=0: no response
    s.record(3, 0.002, {"error_code": 41, "topics": []})
    s.record(1, 0.5, {"error_code": 0, "responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "error_code": 1}, {"partition_index": 1, "error_code": 0}]}]})
    s.record(18, 0.001, {"error_code": 35, "api_keys": []})
    s.record(18, 0.001, {"error_code": 0, "api_keys": EncodedArray(b"")})   # as the handler answers
    assert s.errors == {(0, 6): 2, (3, 41): 1, (1, 1): 1, (18, 35): 1}
    assert s.latency[0].count == 2 and s.latency[3].count == 1 and s.latency[18].count == 2


def test_max_timestamp_through_reads_the_index(tmp_path):
    lg = Log(tmp_path / "p", LogConfig())
    for base_ts, n in ((1000, 3), (900, 2), (5000, 4)):   # out-of-order timestamps: running max
        lg.append(bytearray(build_batch([(None, b"v", [], base_ts + i) for i in range(n)])), leader_epoch=0)
    assert lg.max_timestamp_through(0) == 1002
    assert lg.max_timestamp_through(3) == 1002    # second batch's own max is 901
    assert lg.max_timestamp_through(5) == 5003
    assert lg.max_timestamp_through(100) == 5003
    lg.close()


def test_decode_consumer_assignment():
    def s(x: str) -> bytes:
        return struct.pack(">h", len(x)) + x.encode()
    data = struct.pack(">h", 1) + struct.pack(">i", 2) + s("a") + struct.pack(">i", 2) + struct.pack(">ii", 0, 3) + \
        s("bb") + struct.pack(">i", 0) + struct.pack(">i", -1)
    assert decode_assignment(data) == [("a", [0, 3]), ("bb", [])]
    assert decode_assignment(b"") == []
    assert decode_assignment(data[:9]) == []


@pytest.mark.parametrize("raw,ms", [
    ("1970-01-01T00:00:00Z", 0),
    ("2026-11-23T01:02:03.456Z", 1795395723456),
    ("2026-11-23T03:02:03.456+02:00", 1795395723456),
    ("2026-11-23T01:02:03.456789", 1795395723456),   # no zone: UTC; microseconds dropped
    ("2026-11-23", 1795392000000),
])
def test_parse_time(raw, ms):
    assert parse_time(raw) == ms


@pytest.mark.parametrize("raw", ["", "now", "2026-02-30T00:00:00Z", "1969-12-31T23:59:59Z", "12345"])
def test_parse_time_refuses(raw):
    with pytest.raises(BadRequest) as e:
        parse_time(raw)
    assert e.value.status == 400 and e.value.error == "INVALID_TIMESTAMP"


def test_json_log_line():
    rec = logging.LogRecord("canopy.x", logging.WARNING, __file__, 1, "ISR of %s: %s", ("t-0", [1, 2]), None)
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["level"] == "WARNING" and doc["logger"] == "canopy.x" and doc["msg"] == "ISR of t-0: [1, 2]"
    assert doc["ts"].endswith("Z")


def test_http_listen_options():
    env = {"CANOPY_HTTP_LISTEN": "0.0.0.0:8080", "CANOPY_LISTENERS": "INTERNAL://0.0.0.0:9092",
           "CANOPY_ADVERTISED_LISTENERS": "INTERNAL://canopy-3:9092",
           "CANOPY_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:PLAINTEXT"}
    assert load_config({}, environ=env).http_advertised == ("canopy-3", 8080)
    assert load_config({"http_listen": "127.0.0.5:81"}, environ={}).http_advertised == ("127.0.0.5", 81)
    assert load_config({}, environ={}).http_advertised is None
    for bad in ("8080", "host:port", "h:70000"):
        with pytest.raises(ConfigError):
            load_config({"http_listen": bad}, environ={})
    with pytest.raises(ConfigError):
        load_config({"log_format": "xml"}, environ={})
