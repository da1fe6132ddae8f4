"""Bad input never crashes the broker or corrupts the log.

Each case speaks raw bytes to a real `canopy serve` process, checks the answer (the Kafka
error code, or a closed connection plus a log line), and then checks that the broker still
serves a well-formed request and that the log holds exactly what was validly produced.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest

from protocol.errors import ErrorCode
from protocol.framing import encode_request
from protocol.messages import ApiKey, api

from .rawclient import CLIENT, RawClient
from .rawclient import create_topic as _create
from .rawclient import end_offset as _end_offset
from .rawclient import make_batch as _batch
from .rawclient import produce as _produce

def _assert_alive(broker) -> None:
    c = RawClient(broker.bootstrap)
    try:
        r = c.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert r["error_code"] == 0
    finally:
        c.close()
    assert broker.proc.poll() is None, broker.log_text()


@pytest.fixture
def client(broker):
    c = RawClient(broker.bootstrap)
    yield c
    c.close()


def test_bad_crc_is_corrupt_message_and_not_stored(broker, client):
    _create(client, "crc")
    batch = _batch([b"a", b"b"])
    batch[-1] ^= 0xFF  # flip a bit inside the CRC-covered area
    assert _produce(client, "crc", batch)["error_code"] == ErrorCode.CORRUPT_MESSAGE
    assert _end_offset(client, "crc") == 0
    assert _produce(client, "crc", _batch([b"ok"]))["error_code"] == 0
    assert _end_offset(client, "crc") == 1


def test_wrong_magic_is_rejected(broker, client):
    _create(client, "magic")
    batch = _batch([b"a"])
    batch[16] = 1
    err = _produce(client, "magic", batch)["error_code"]
    assert err in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, ErrorCode.INVALID_RECORD)
    assert _end_offset(client, "magic") == 0


def test_lying_batch_length_is_corrupt(broker, client):
    _create(client, "len")
    batch = _batch([b"a", b"b"])
    struct.pack_into(">i", batch, 8, len(batch) + 100)
    assert _produce(client, "len", batch)["error_code"] == ErrorCode.CORRUPT_MESSAGE
    batch = _batch([b"a", b"b"])
    assert _produce(client, "len", batch[:40])["error_code"] == ErrorCode.CORRUPT_MESSAGE
    assert _end_offset(client, "len") == 0


def test_negative_record_count_is_rejected(broker, client):
    _create(client, "neg")
    batch = _batch([b"a"])
    struct.pack_into(">i", batch, 57, -5)
    from protocol.records import compute_crc
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    err = _produce(client, "neg", batch)["error_code"]
    assert err in (ErrorCode.INVALID_RECORD, ErrorCode.CORRUPT_MESSAGE)
    assert _end_offset(client, "neg") == 0


def test_message_too_large(broker, client):
    _create(client, "big", {"max.message.bytes": "2000"})
    assert _produce(client, "big", _batch([b"x" * 5000]))["error_code"] == ErrorCode.MESSAGE_TOO_LARGE
    assert _produce(client, "big", _batch([b"x" * 100]))["error_code"] == 0


def test_unknown_topic_and_partition(broker, client):
    assert _produce(client, "never-created", _batch([b"a"]))["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    r = client.request(ApiKey.FETCH, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "topics": [
        {"topic": "never-created", "partitions": [{"partition": 3, "fetch_offset": 0, "partition_max_bytes": 1000}]}]})
    assert r["responses"][0]["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_fetch_offset_out_of_range(broker, client):
    _create(client, "oor")
    _produce(client, "oor", _batch([b"a", b"b"]))
    r = client.request(ApiKey.FETCH, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "topics": [
        {"topic": "oor", "partitions": [{"partition": 0, "fetch_offset": 99, "partition_max_bytes": 1000}]}]})
    assert r["responses"][0]["partitions"][0]["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize("name", ["", "a/b", "..", "x" * 250, "bad name", "tøpic"])
def test_invalid_topic_names(broker, client, name):
    r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout_ms": 1000})
    assert r["topics"][0]["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    r = client.request(ApiKey.METADATA, 9, {"topics": [{"name": name}], "allow_auto_topic_creation": True})
    assert r["topics"][0]["error_code"] == ErrorCode.INVALID_TOPIC_EXCEPTION
    _assert_alive(broker)


def test_invalid_topic_configs(broker, client):
    for configs in ({"retention.ms": "soon"}, {"message.timestamp.type": "Never"}, {"no.such.config": "1"},
                    {"segment.bytes": "0"}):
        r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{
            "name": "cfg", "num_partitions": 1, "replication_factor": 1,
            "configs": [{"name": k, "value": v} for k, v in configs.items()]}], "timeout_ms": 1000})
        assert r["topics"][0]["error_code"] == ErrorCode.INVALID_CONFIG, configs


def test_invalid_acks(broker, client):
    _create(client, "acks")
    assert _produce(client, "acks", _batch([b"a"]), acks=7)["error_code"] == ErrorCode.INVALID_REQUIRED_ACKS


def test_unknown_api_key_closes_connection(broker, client):
    client.send_raw(struct.pack(">ihhih", 10, 9999, 0, 1, -1))
    assert client.closed_by_peer()
    assert "unknown API key" in _wait_log(broker, "unknown API key")
    _assert_alive(broker)


def test_unsupported_version_closes_connection(broker, client):
    client.send_raw(struct.pack(">ihhih", 10, ApiKey.METADATA, 99, 1, -1))
    assert client.closed_by_peer()
    _assert_alive(broker)


def test_unsupported_api_versions_version_gets_error_35(broker, client):
    client.send_raw(struct.pack(">ihhih", 10, ApiKey.API_VERSIONS, 99, 7, -1))
    frame = client.recv_frame()
    (corr,) = struct.unpack_from(">i", frame)
    assert corr == 7
    body = api(ApiKey.API_VERSIONS).response.decode(frame[4:], 0)
    assert body["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert any(k["api_key"] == ApiKey.API_VERSIONS for k in body["api_keys"])


def test_malformed_body_closes_connection(broker, client):
    header = struct.pack(">hhih", ApiKey.METADATA, 4, 1, -1)
    body = struct.pack(">i", 1_000_000)  # claims a million topics, sends none
    client.send_raw(struct.pack(">i", len(header + body)) + header + body)
    assert client.closed_by_peer()
    _assert_alive(broker)


def test_truncated_header_closes_connection(broker, client):
    client.send_raw(struct.pack(">i", 3) + b"\x00\x03\x00")
    assert client.closed_by_peer()
    _assert_alive(broker)


@pytest.mark.parametrize("size", [-1, 100 * 1024 * 1024 + 1, 0x7FFFFFFF])
def test_oversize_or_negative_frame_closes_connection(broker, client, size):
    client.send_raw(struct.pack(">i", size) + b"\x00" * 64)
    assert client.closed_by_peer()
    _wait_log(broker, "exceeds")
    _assert_alive(broker)


def test_acks_zero_sends_no_response(broker, client):
    _create(client, "acks0")
    client.correlation += 1
    client.send_raw(encode_request(ApiKey.PRODUCE, 9, client.correlation, CLIENT, {
        "acks": 0, "timeout_ms": 1000,
        "topic_data": [{"name": "acks0", "partition_data": [{"index": 0, "records": bytes(_batch([b"z"]))}]}]}))
    # The next response on the connection must be for the next request, not the produce.
    assert _end_offset(client, "acks0") == 1


def _wait_log(broker, needle: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = broker.log_text()
        if needle in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in broker log:\n{broker.log_text()}")
