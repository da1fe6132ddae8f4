"""controller/etcd.py's pure parts: endpoint strings, the JSON gateway's encodings (base64
keys and values, int64 as strings, proto3 leaving out zero fields) and its error shapes.
The byte-level facts here were read off etcd 3.4.23's gateway (tests/cluster/test_etcd_client.py
runs the same calls against a real cluster)."""
from __future__ import annotations

import base64

import pytest

from controller.etcd import (Compare, EtcdClient, KeyValue, Op, TxnResult, _error_of,
                             _is_unavailable, parse_endpoints, prefix_range_end)


def b64(s: bytes) -> str:
    return base64.b64encode(s).decode()


@pytest.mark.parametrize("text, expected", [
    ("etcd://127.0.0.21:2379,127.0.0.22:2380", [("127.0.0.21", 2379), ("127.0.0.22", 2380)]),
    ("localhost:2379", [("localhost", 2379)]),
    (" etcd-0:2379 , etcd-1:2379 ", [("etcd-0", 2379), ("etcd-1", 2379)]),
    ("etcd://[::1]:2379", [("::1", 2379)]),
])
def test_parse_endpoints(text, expected):
    assert parse_endpoints(text) == expected


@pytest.mark.parametrize("text", [
    "", "etcd://", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "h:port",
    "http://127.0.0.1:2379", "127.0.0.1:2379,", "127.0.0.1:2379,,h:1", "h :1", "[::1]2379",
])
def test_parse_endpoints_refuses_with_one_line(text):
    with pytest.raises(ValueError) as e:
        parse_endpoints(text)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError):
        EtcdClient(text)


def test_prefix_range_end():
    assert prefix_range_end("/canopy/brokers/") == b"/canopy/brokers0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"a\xfe") == b"a\xff"
    # No key is greater than every 0xff prefix: "\0" is etcd's "to the end".
    assert prefix_range_end(b"") == b"\x00"
    assert prefix_range_end(b"\xff\xff") == b"\x00"


def test_key_value_defaults_missing_proto3_fields():
    # A key put with an empty value and no lease, as the gateway sends it.
    kv = KeyValue.from_json({"key": b64(b"/a/y"), "create_revision": "4", "mod_revision": "4",
                             "version": "1"})
    assert kv == KeyValue("/a/y", b"", 4, 4, 1, 0)
    # A DELETE watch event's kv: key and mod_revision only.
    assert KeyValue.from_json({"key": b64(b"/a/x"), "mod_revision": "9"}) == KeyValue("/a/x", b"", 0, 9, 0, 0)


def test_compare_and_op_builders():
    assert Compare.create_revision("/c", "=", 0) == {
        "key": b64(b"/c"), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
    assert Compare.mod_revision("/c", "<", 7)["result"] == "LESS"
    assert Compare.version("/c", ">", 1) == {"key": b64(b"/c"), "target": "VERSION",
                                            "result": "GREATER", "version": "1"}
    assert Compare.value("/c", "!=", b"\x00x") == {"key": b64(b"/c"), "target": "VALUE",
                                                  "result": "NOT_EQUAL", "value": b64(b"\x00x")}
    with pytest.raises(ValueError):
        Compare.version("/c", "==", 1)
    assert Op.put("/k", b"v") == {"request_put": {"key": b64(b"/k"), "value": b64(b"v")}}
    assert Op.put("/k", b"v", lease=7)["request_put"]["lease"] == "7"
    assert Op.get("/p/", prefix=True) == {"request_range": {"key": b64(b"/p/"), "range_end": b64(b"/p0")}}
    assert Op.delete("/k") == {"request_delete_range": {"key": b64(b"/k")}}
    # Every key: etcd refuses an empty key, so "" becomes ["\0", "\0").
    assert Op.get("", prefix=True) == {"request_range": {"key": b64(b"\x00"), "range_end": b64(b"\x00")}}


def test_txn_result_decoding():
    # A failed txn leaves out "succeeded"; its failure branch ran a get and a delete.
    r = TxnResult.from_json({
        "header": {"revision": "4"},
        "responses": [
            {"response_range": {"header": {"revision": "4"}, "count": "1", "kvs": [
                {"key": b64(b"/a/x"), "create_revision": "3", "mod_revision": "3", "version": "1",
                 "value": b64(b"hello")}]}},
            {"response_delete_range": {"header": {"revision": "4"}}}]})
    assert not r.succeeded and r.revision == 4
    assert r.responses[0] == [KeyValue("/a/x", b"hello", 3, 3, 1, 0)]
    assert r.responses[1] == {"header": {"revision": "4"}}
    # An empty branch: no "responses" at all.
    assert TxnResult.from_json({"header": {"revision": "5"}, "succeeded": True}) == TxnResult(True, 5, [])


def test_gateway_error_shapes():
    # Unary calls.
    assert _error_of({"error": "etcdserver: key is not provided", "code": 3,
                      "message": "etcdserver: key is not provided"}) == (3, "etcdserver: key is not provided")
    # Streamed calls (lease keepalive, watch).
    assert _error_of({"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader",
                                "http_status": "Service Unavailable"}}) == (14, "etcdserver: no leader")
    # LeaseGrantResponse has a field named "error" of its own; answers carry a header.
    assert _error_of({"header": {"revision": "1"}, "ID": "5", "TTL": "2"}) is None
    assert _error_of({"result": {"header": {}, "created": True}}) is None
    # What a member without a quorum answers: unavailable (fail over), not a bad request.
    assert _is_unavailable(14, "etcdserver: no leader")
    assert _is_unavailable(14, "etcdserver: request timed out")
    assert _is_unavailable(2, "context deadline exceeded")
    assert not _is_unavailable(5, "etcdserver: requested lease not found")
    assert not _is_unavailable(3, "etcdserver: key is not provided")
