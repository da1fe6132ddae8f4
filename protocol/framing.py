"""Size-prefixed Kafka frames and request/response headers, sans-IO (h11 style).

Bytes go in through ``FrameReader.feed``; complete request frames come out. Nothing here
touches a socket, so the same code serves the broker, the replication client and tests.
"""
from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

from construct import StreamError

from .messages import api
from .schema import INT16, INT32, SchemaError, UVARINT, ViewStream, read_uvarint, uvarint_bytes

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhi")
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
# A pending frame at least this much short of complete is worth a receive low-water mark
# (FrameReader.receive_low_water); below it, one more wake-up costs less than the
# setsockopt calls.
LOW_WATER_MIN = 64 * 1024
# ... and at most this much is waited for per wake-up: a multi-MiB answer is still copied
# as it arrives. A follower at acks=all otherwise received each Fetch answer in ~90 KiB
# pieces, a 1 MiB Produce woke the broker for every 64 KiB segment (bench/README.md).
LOW_WATER_CAP = 1 << 20
# A new reader's first buffer: under glibc's mmap threshold (128 KiB, fixed by the broker),
# so it comes from the heap without a page fault per 4 KiB.
FIRST_BUFFER = 16 * 1024
# sys.getrefcount(self._buf) when nothing else refers to the buffer: the attribute and
# getrefcount's own argument. A memoryview of it (a frame handed out) adds one.
_UNSHARED = 2


class FrameTooLarge(Exception):
    def __init__(self, size: int, limit: int):
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size


class FrameReader:
    """Splits a byte stream into frames, with as few copies as Python allows.

    Two ways in: ``feed(data)`` for bytes already received, or ``get_buffer()`` +
    ``commit(n)`` so the caller can ``recv_into`` the reader's own buffer (the broker
    does; a 1 MiB Produce then lands once in memory and reaches storage as a view).

    Frames come out as memoryviews into that buffer. The reader never writes over bytes it
    has handed out: when a buffer is full it starts a new one (carrying over only the
    partial frame), so earlier frames stay valid as long as someone holds them.

    A declared size is never allocated up front beyond what is needed to hold it:
    sizes over ``max_frame_bytes`` (or negative) are refused as soon as the 4-byte prefix
    is seen, so a hostile 2 GiB prefix costs nothing."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_REQUEST_BYTES, chunk_size: int = 256 * 1024):
        self.max_frame_bytes = max_frame_bytes
        self.chunk_size = chunk_size
        # The first buffer is small; the first frame that does not fit brings one of
        # chunk_size or more (get_buffer). Most connections only ever send small requests
        # (ApiVersions, Metadata, heartbeats), and a reader is made anew after each idle
        # spell (broker/server.py): 256 KiB up front came from mmap, zeroed page by page,
        # ~90 µs of every new connection's first answer.
        self._buf = bytearray(min(chunk_size, FIRST_BUFFER))
        self._pos = 0   # start of the first unconsumed byte
        self._end = 0   # end of received bytes
        self._low_water = 1   # the low-water mark last handed out (a socket's default)

    @property
    def buffered(self) -> int:
        return self._end - self._pos

    def _pending_frame_size(self) -> int | None:
        if self._end - self._pos < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buf, self._pos)
        if size < 0 or size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes)
        return size

    def get_buffer(self, min_size: int = 1) -> memoryview:
        """Writable space for the next received bytes (at least ``min_size``)."""
        if self._pos == self._end and self._end and sys.getrefcount(self._buf) <= _UNSHARED:
            # Nothing pending and no frame handed out is alive: receive from the start, so
            # the next frame is not split at the buffer's end and moved to the front (a
            # follower's every multi-MiB response was, copied twice).
            self._pos = self._end = 0
        if len(self._buf) - self._end < max(min_size, 1):
            # Full: start a fresh buffer, carrying over only the partial frame; frames
            # handed out earlier keep the old buffer alive. It is sized for the pending
            # frame, but grows at most ~2x per step, so a declared-but-unsent 100 MiB
            # frame costs memory only as its bytes actually arrive.
            size = self._pending_frame_size()
            have = self._end - self._pos
            rest = (4 + size - have) if size is not None else self.chunk_size
            step = min(max(rest, min_size), max(4 * self.chunk_size, 2 * have))
            need = max(self.chunk_size, have + step, have + min_size)
            if len(self._buf) >= need and sys.getrefcount(self._buf) <= _UNSHARED:
                # No frame handed out from this buffer is alive any more (each view
                # holds a reference to it), so the partial frame moves to the front and
                # the buffer is reused. A fresh 1 MiB bytearray per Produce meant page
                # faults + zeroing: 45 % of the broker's produce time in W1 once large
                # allocations come straight from mmap (broker/server.py fixes glibc's
                # mmap threshold so idle connections' buffers go back to the OS).
                buf = self._buf
                buf[:have] = buf[self._pos:self._end]
                self._pos, self._end = 0, have
            else:
                new = bytearray(need)
                new[:have] = self._buf[self._pos:self._end]
                self._buf, self._pos, self._end = new, 0, have
        return memoryview(self._buf)[self._end:]

    def commit(self, n: int) -> None:
        self._end += n

    def missing(self) -> int:
        """Bytes still to arrive before the pending frame is complete (before its size
        prefix is complete: what the prefix still lacks)."""
        size = self._pending_frame_size()
        have = self._end - self._pos
        return 4 - have if size is None else max(0, 4 + size - have)

    def receive_low_water(self, cap: int) -> int:
        """How many bytes should be waiting before the receiver is woken (a socket's
        SO_RCVLOWAT): the rest of a large pending frame, at most ``cap``; 1 otherwise.
        A multi-MiB Fetch answer or Produce otherwise wakes its receiver for every
        64 KiB segment loopback delivers (the kernel still wakes it at end of stream or
        under memory pressure, so a frame that never completes cannot hang it)."""
        missing = self.missing()
        return min(missing, cap) if missing >= LOW_WATER_MIN else 1

    def low_water_change(self, cap: int = LOW_WATER_CAP) -> int | None:
        """``receive_low_water`` when it differs from what this reader last returned, for
        the receiver to set on its socket before waiting; None when the socket has it
        already (a setsockopt only when it changes: twice per large frame)."""
        want = self.receive_low_water(cap)
        if want == self._low_water:
            return None
        self._low_water = want
        return want

    def feed(self, data) -> None:
        n = len(data)
        self.get_buffer(n)[:n] = data
        self.commit(n)

    def next_frame(self) -> memoryview | None:
        size = self._pending_frame_size()
        if size is None or self._end - self._pos < 4 + size:
            return None
        start = self._pos + 4
        self._pos = start + size
        return memoryview(self._buf)[start:self._pos]


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
    stream = ViewStream(frame)
    stream.seek(8)
    client_id_len = INT16._parse(stream, None, "client_id")
    if client_id_len >= 0:
        raw = stream.read(client_id_len)
        if len(raw) != client_id_len:
            raise SchemaError("client_id truncated")
        client_id = str(raw, "utf-8", "replace")
    else:
        client_id = None
    header_version = 1
    a = api(api_key)
    if a is not None and a.versions[0] <= api_version <= a.versions[1]:
        header_version = a.request_header_version(api_version)
    if header_version >= 2:
        _skip_tagged_fields(stream)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version), stream.tell()


def _skip_tagged_fields(stream: ViewStream) -> None:
    try:
        for _ in range(read_uvarint(stream, "header tagged fields")):
            read_uvarint(stream, "tag")
            size = read_uvarint(stream, "tag size")
            if len(stream.read(size)) != size:
                raise SchemaError("tagged field truncated")
    except StreamError as e:  # a varint cut short: hostile input is a SchemaError like any other
        raise SchemaError(f"header tagged fields truncated: {e}") from e


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


def parse_response_header(frame, api_key: int, api_version: int) -> tuple[int, int]:
    """(correlation id, offset of the body) of a response frame (without its size prefix)
    to a request of (api_key, api_version), for canopy's own clients (replication, tests,
    benches). Header v1 (KIP-482) ends in tagged fields: canopy sends none, but another
    broker may, so they are read, not assumed absent."""
    if len(frame) < 4:
        raise SchemaError("response header truncated")
    (correlation_id,) = _SIZE.unpack_from(frame, 0)
    if api(api_key).response_header_version(api_version) == 0:
        return correlation_id, 4
    stream = ViewStream(frame)
    stream.seek(4)
    _skip_tagged_fields(stream)
    return correlation_id, stream.tell()


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
