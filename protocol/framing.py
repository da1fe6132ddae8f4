"""Size-prefixed Kafka frames and request/response headers, sans-IO (h11 style).

Bytes go in through ``FrameReader.feed``; complete request frames come out. Nothing here
touches a socket, so the same code serves the broker, the replication client and tests.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from io import BytesIO

from construct import StreamError

from .messages import api
from .schema import INT16, INT32, SchemaError, UVARINT, read_uvarint, uvarint_bytes

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhi")
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes


class FrameTooLarge(Exception):
    def __init__(self, size: int, limit: int):
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size


class FrameReader:
    """Splits a byte stream into frames. A declared size is never allocated up front:
    a hostile 2 GiB length prefix costs nothing until the bytes actually arrive, and sizes
    over ``max_frame_bytes`` are refused as soon as the 4-byte prefix is seen."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next_frame(self) -> bytes | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            self._compact()
            return None
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes)
        end = pos + 4 + size
        if len(buf) < end:
            self._compact()
            return None
        frame = bytes(buf[pos + 4:end])
        self._pos = end
        return frame

    def _compact(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int


def parse_request_header(frame: bytes) -> tuple[RequestHeader, int]:
    """Returns the header and the offset where the request body starts.

    The header version depends on whether (api_key, api_version) is a flexible version;
    for keys or versions canopy does not know, header v1 is read, which is enough to
    answer with UNSUPPORTED_VERSION (clients only need the correlation id back)."""
    if len(frame) < 8:
        raise SchemaError("request header truncated")
    api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    stream = BytesIO(frame)
    stream.seek(8)
    client_id_len = INT16._parse(stream, None, "client_id")
    if client_id_len >= 0:
        raw = stream.read(client_id_len)
        if len(raw) != client_id_len:
            raise SchemaError("client_id truncated")
        client_id = raw.decode("utf-8", "replace")
    else:
        client_id = None
    header_version = 1
    a = api(api_key)
    if a is not None and a.versions[0] <= api_version <= a.versions[1]:
        header_version = a.request_header_version(api_version)
    if header_version >= 2:
        _skip_tagged_fields(stream)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version), stream.tell()


def _skip_tagged_fields(stream: BytesIO) -> None:
    try:
        for _ in range(read_uvarint(stream, "header tagged fields")):
            read_uvarint(stream, "tag")
            size = read_uvarint(stream, "tag size")
            if len(stream.read(size)) != size:
                raise SchemaError("tagged field truncated")
    except StreamError as e:  # a varint cut short: hostile input is a SchemaError like any other
        raise SchemaError(f"request header truncated: {e}") from e


def encode_request_header(api_key: int, api_version: int, correlation_id: int,
                          client_id: str | None) -> bytes:
    """Used by canopy's own outgoing requests (replication) and by tests."""
    cid = client_id.encode() if client_id is not None else None
    out = _HEADER_FIXED.pack(api_key, api_version, correlation_id)
    out += struct.pack(">h", -1) if cid is None else struct.pack(">h", len(cid)) + cid
    a = api(api_key)
    if a is not None and a.request_header_version(api_version) >= 2:
        out += b"\x00"
    return out


def response_header(correlation_id: int, header_version: int) -> bytes:
    if header_version >= 1:
        return _SIZE.pack(correlation_id) + b"\x00"  # no tagged fields
    return _SIZE.pack(correlation_id)


def frame(*parts: bytes) -> bytes:
    body = b"".join(parts)
    return _SIZE.pack(len(body)) + body


def encode_response(correlation_id: int, api_key: int, api_version: int, body: dict) -> bytes:
    """A complete size-prefixed response frame."""
    a = api(api_key)
    payload = a.response.encode(body, api_version)
    return frame(response_header(correlation_id, a.response_header_version(api_version)), payload)


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: dict) -> bytes:
    a = api(api_key)
    return frame(encode_request_header(api_key, api_version, correlation_id, client_id),
                 a.request.encode(body, api_version))


__all__ = ["FrameReader", "FrameTooLarge", "RequestHeader", "parse_request_header",
           "encode_request_header", "response_header", "frame", "encode_response",
           "encode_request", "DEFAULT_MAX_REQUEST_BYTES", "INT32", "UVARINT", "uvarint_bytes"]
