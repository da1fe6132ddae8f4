"""A minimal raw Kafka client for tests that need exact control over the bytes sent:
it frames requests with canopy's own sans-IO codec (itself cross-checked against
kafka-python's classes) and reads responses off a plain socket."""
from __future__ import annotations

import socket
import struct
import time

from kafka.record.default_records import DefaultRecordBatchBuilder

from protocol.framing import encode_request, parse_response_header
from protocol.messages import ApiKey, api

CLIENT = "raw-test-client"


class RawClient:
    def __init__(self, bootstrap: str):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes | None:
        head = self._recv_exact(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def request(self, key: int, version: int, body: dict, timeout: float = 10) -> dict:
        self.send_only(key, version, body)
        return self.receive(timeout)

    def send_only(self, key: int, version: int, body: dict, piece: int = 0, pause: float = 0.0) -> bytes:
        """Send a request without waiting (e.g. to a paused broker); ``receive`` reads the answer.
        With ``piece``, the frame goes out in pieces of that size, ``pause`` seconds apart.
        Returns the frame sent."""
        self.correlation += 1
        self._pending = (key, version)
        data = encode_request(key, version, self.correlation, CLIENT, body)
        for start in range(0, len(data), piece or len(data)):
            if start:
                time.sleep(pause)
            self.send_raw(data[start:start + (piece or len(data))])
        return data

    def receive(self, timeout: float = 10) -> dict:
        key, version = self._pending
        self.sock.settimeout(timeout)
        frame = self.recv_frame()
        assert frame is not None, "connection closed"
        corr, offset = parse_response_header(frame, key, version)
        assert corr == self.correlation
        return api(key).response.decode(frame[offset:], version)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def make_batch(values, timestamp=1_700_000_000_000, producer_id=-1, producer_epoch=-1, base_sequence=-1,
               batch_size: int = 1 << 20) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=producer_id, producer_epoch=producer_epoch,
                                  base_sequence=base_sequence, batch_size=batch_size)
    for i, v in enumerate(values):
        b.append(i, timestamp=timestamp + i, key=None, value=v, headers=[])
    return bytearray(b.build())


def init_producer_id(client: RawClient) -> tuple[int, int]:
    """InitProducerId v4 for an idempotent (non-transactional) producer: (id, epoch)."""
    r = client.request(22, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                               "producer_id": -1, "producer_epoch": -1})
    assert r["error_code"] == 0, r
    return r["producer_id"], r["producer_epoch"]


def produce(client: RawClient, topic: str, records: bytes, acks: int = 1, version: int = 9,
            timeout_ms: int = 5000) -> dict:
    resp = client.request(ApiKey.PRODUCE, version, {
        "acks": acks, "timeout_ms": timeout_ms,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": bytes(records)}]}]},
        timeout=timeout_ms / 1000 + 10)
    return resp["responses"][0]["partition_responses"][0]


def create_topic(client: RawClient, topic: str, configs: dict | None = None) -> None:
    r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{
        "name": topic, "num_partitions": 1, "replication_factor": 1,
        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}], "timeout_ms": 5000})
    assert r["topics"][0]["error_code"] == 0, r


def end_offset(client: RawClient, topic: str) -> int:
    r = client.request(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    return r["topics"][0]["partitions"][0]["offset"]


