"""protocol.framing: size-prefixed frames, request headers v1/v2, response headers v0/v1.

Header bytes are cross-checked against kafka-python 3.0.12's own header encoder/decoder.
"""
from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.metadata import (
    ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse)

from protocol.framing import (
    DEFAULT_MAX_REQUEST_BYTES, FIRST_BUFFER, LOW_WATER_MIN, FrameReader, FrameTooLarge, encode_request,
    encode_request_header, encode_response, frame, parse_request_header, parse_response_header,
    response_header)
from protocol.messages import api
from protocol.schema import SchemaError, uvarint_bytes

SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _size(n: int) -> bytes:
    return struct.pack(">i", n)


def _drain(reader: FrameReader) -> list[bytes]:
    out = []
    while (f := reader.next_frame()) is not None:
        out.append(f)
    return out


# --------------------------------------------------------------------------- FrameReader

def test_single_frame():
    r = FrameReader()
    r.feed(frame(b"hello"))
    assert r.next_frame() == b"hello"
    assert r.next_frame() is None
    assert r.buffered == 0


def test_empty_frame():
    r = FrameReader()
    r.feed(_size(0))
    assert r.next_frame() == b""
    assert r.next_frame() is None


def test_partial_feeds_byte_by_byte():
    payload = b"x" * 300
    data = frame(payload)
    r = FrameReader()
    for i, b in enumerate(data[:-1]):
        r.feed(bytes([b]))
        assert r.next_frame() is None, i
    r.feed(data[-1:])
    assert r.next_frame() == payload
    assert r.buffered == 0


def test_missing_counts_what_the_pending_frame_still_lacks():
    r = FrameReader()
    assert r.missing() == 4            # nothing yet: the size prefix
    r.feed(b"\x00\x00")
    assert r.missing() == 2
    r.feed(b"\x00\x0a" + b"abc")
    assert r.missing() == 7
    r.feed(b"defghij" + b"\x00")     # complete, plus a byte of the next prefix
    assert r.missing() == 0
    assert r.next_frame() == b"abcdefghij"
    assert r.missing() == 3


def test_receive_low_water_only_for_the_rest_of_a_large_frame():
    cap = 1 << 20
    r = FrameReader()
    assert r.receive_low_water(cap) == 1                  # between frames: wake on any byte
    r.feed(_size(3 << 20) + b"x" * 1000)
    assert r.receive_low_water(cap) == cap                # 3 MiB to go: once per cap
    r.feed(b"x" * ((3 << 20) - 1000 - 200_000))
    assert r.receive_low_water(cap) == 200_000            # exactly the rest
    r.feed(b"x" * (200_000 - LOW_WATER_MIN + 1))
    assert r.receive_low_water(cap) == 1                  # a small rest: not worth a setsockopt
    r.feed(b"x" * (LOW_WATER_MIN - 1))
    assert len(r.next_frame()) == 3 << 20
    assert r.receive_low_water(cap) == 1


def test_partial_size_prefix():
    r = FrameReader()
    r.feed(b"\x00\x00")
    assert r.next_frame() is None
    r.feed(b"\x00\x03ab")
    assert r.next_frame() is None
    assert r.buffered == 6
    r.feed(b"c")
    assert r.next_frame() == b"abc"


def test_multiple_frames_in_one_feed():
    frames = [b"a", b"", b"bcd", b"e" * 1000]
    r = FrameReader()
    r.feed(b"".join(frame(f) for f in frames) + _size(5) + b"12")  # plus a partial one
    assert _drain(r) == frames
    assert r.buffered == 6
    r.feed(b"345")
    assert _drain(r) == [b"12345"]


@settings(max_examples=200, **SETTINGS)
@given(st.lists(st.binary(max_size=50), max_size=8), st.data())
def test_any_chunking_yields_the_same_frames(frames, data):
    stream = b"".join(frame(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    r, got, prev = FrameReader(), [], 0
    for cut in [*cuts, len(stream)]:
        r.feed(stream[prev:cut])
        prev = cut
        got += _drain(r)
    assert got == frames
    assert r.buffered == 0


def test_frame_at_the_limit_is_accepted():
    r = FrameReader(max_frame_bytes=10)
    r.feed(frame(b"0123456789"))
    assert r.next_frame() == b"0123456789"


@pytest.mark.parametrize("size", [11, 1000, DEFAULT_MAX_REQUEST_BYTES + 1])
def test_over_limit_refused_from_the_prefix_alone(size):
    limit = 10 if size < DEFAULT_MAX_REQUEST_BYTES else DEFAULT_MAX_REQUEST_BYTES
    r = FrameReader(max_frame_bytes=limit)
    r.feed(_size(size))  # no body at all: refused before any of it arrives
    with pytest.raises(FrameTooLarge) as e:
        r.next_frame()
    assert e.value.size == size


@pytest.mark.parametrize("size", [-1, -2, -(2**31)])
def test_negative_size_refused(size):
    r = FrameReader()
    r.feed(_size(size) + b"abc")
    with pytest.raises(FrameTooLarge) as e:
        r.next_frame()
    assert e.value.size == size


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_two_gib_declared_size_refused_without_allocating():
    r = FrameReader()

    def go():
        r.feed(_size(2**31 - 1) + b"\x00" * 16)
        with pytest.raises(FrameTooLarge):
            r.next_frame()

    assert _peak_bytes(go) < 1 << 16


def test_two_gib_declared_size_within_limit_waits_without_allocating():
    """Even when a (misconfigured) limit admits 2 GiB, the reader only buffers what has
    actually arrived: the declared size is never used to allocate."""
    r = FrameReader(max_frame_bytes=2**31 - 1)

    def go():
        r.feed(_size(2**31 - 1))
        for _ in range(100):
            r.feed(b"\x00" * 100)
            assert r.next_frame() is None

    assert _peak_bytes(go) < 1 << 16
    assert r.buffered == 4 + 100 * 100


def test_full_buffer_reused_only_once_no_frame_from_it_is_held():
    """A full buffer is reused in place (no fresh allocation per large frame) once every
    frame handed out from it is gone; a frame still held keeps its bytes."""
    r = FrameReader(chunk_size=64)
    r.feed(_size(100) + b"a" * 100)
    f = r.next_frame()
    del f
    buf = id(r._buf)  # not a reference: that would count as a held frame
    r.feed(_size(100) + b"b" * 100)  # does not fit after the first: reused
    assert id(r._buf) == buf
    f = r.next_frame()
    assert bytes(f) == b"b" * 100
    r.feed(_size(100) + b"c" * 100)  # f still held: a new buffer
    assert id(r._buf) != buf
    assert bytes(f) == b"b" * 100
    assert bytes(r.next_frame()) == b"c" * 100


def test_a_new_reader_starts_small_and_takes_a_large_frame_whole():
    """A new connection's reader costs FIRST_BUFFER bytes (from the heap, not a fresh
    256 KiB mapping zeroed page by page); the first frame that does not fit brings a
    buffer of at least chunk_size, and small frames keep the first buffer."""
    r = FrameReader()
    assert len(r.get_buffer()) == FIRST_BUFFER < r.chunk_size
    small = b"s" * 100
    r.feed(_size(len(small)) + small)
    assert bytes(r.next_frame()) == small
    assert len(r.get_buffer()) == FIRST_BUFFER
    big = bytes(range(256)) * 1200   # 300 KiB
    stream = _size(len(big)) + big
    for i in range(0, len(stream), 7000):
        r.feed(stream[i:i + 7000])
    assert bytes(r.next_frame()) == big


def test_partial_frame_carried_over_when_the_buffer_is_reused():
    r = FrameReader(chunk_size=64)
    frames = [bytes([i]) * (30 + i) for i in range(40)]
    stream = b"".join(_size(len(x)) + x for x in frames)
    got = []
    for i in range(0, len(stream), 37):
        r.feed(stream[i:i + 37])
        got += [bytes(f) for f in _drain(r)]  # copied, views dropped: buffer reusable
    assert got == frames


# --------------------------------------------------------------------------- request headers

def _raw_header(key, version, corr, client_id: bytes | None, tagged: bytes | None = None) -> bytes:
    out = struct.pack(">hhi", key, version, corr)
    out += _size(-1)[2:] if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if tagged is not None:
        out += tagged
    return out


def test_header_v1_non_flexible():
    body = api(3).request.encode({"topics": None}, 4)
    data = _raw_header(3, 4, 42, b"my-client") + body
    h, offset = parse_request_header(data)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.header_version) == (
        3, 4, 42, "my-client", 1)
    assert data[offset:] == body
    assert api(3).request.decode(data[offset:], 4)["topics"] is None


def test_header_v2_flexible_with_tagged_fields():
    body = api(3).request.encode({"topics": [{"name": "t"}]}, 12)
    # Two unknown tagged fields in the header: tag 0 (3 bytes), tag 5 (0 bytes).
    tagged = b"\x02" + b"\x00\x03abc" + b"\x05\x00"
    data = _raw_header(3, 12, -7, b"c", tagged) + body
    h, offset = parse_request_header(data)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.header_version) == (
        3, 12, -7, "c", 2)
    assert data[offset:] == body
    assert api(3).request.decode(data[offset:], 12)["topics"][0]["name"] == "t"


def test_header_v2_client_id_is_not_compact():
    """client_id stays an int16-length string in header v2 (flexibleVersions: none), so a
    broker can read any ApiVersions request's header, even one of an unknown version."""
    data = encode_request_header(18, 3, 1, "abc")
    assert data == _raw_header(18, 3, 1, b"abc", b"\x00")


def test_null_client_id():
    for version, hv in ((4, 1), (12, 2)):
        data = encode_request_header(3, version, 9, None)
        assert data[8:10] == b"\xff\xff"
        h, offset = parse_request_header(data)
        assert h.client_id is None and h.header_version == hv and offset == len(data)


def test_empty_client_id():
    h, _ = parse_request_header(_raw_header(3, 4, 1, b""))
    assert h.client_id == ""


def test_unknown_api_key_reads_header_v1():
    """Unknown key: header v1 is enough to answer UNSUPPORTED_VERSION with the right
    correlation id; what follows is left unread."""
    data = _raw_header(9999, 3, 77, b"cli") + b"\x00garbage"
    h, offset = parse_request_header(data)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.header_version) == (
        9999, 3, 77, "cli", 1)
    assert data[offset:] == b"\x00garbage"


def test_unknown_version_of_known_key_reads_header_v1():
    # ApiVersions v99 from a newer client: flexible in reality, but the broker cannot know,
    # so it reads header v1 and answers with a v0 ApiVersions error body (KIP-511).
    data = _raw_header(18, 99, 5, b"new", b"\x00")
    h, offset = parse_request_header(data)
    assert (h.correlation_id, h.header_version, offset) == (5, 1, len(data) - 1)


@pytest.mark.parametrize("data", [
    b"",
    b"\x00\x03\x00\x04\x00\x00\x00",                      # 7 bytes
    b"\x00\x03\x00\x04\x00\x00\x00\x01",                  # no client_id length
    b"\x00\x03\x00\x04\x00\x00\x00\x01\x00",              # half a client_id length
    b"\x00\x03\x00\x04\x00\x00\x00\x01\x00\x05ab",        # client_id truncated
    b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01a",         # v2: tagged-field count missing
    b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01a\x01",     # v2: tag missing
    b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01a\x01\x00\x05ab",  # v2: tag value truncated
    b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01a" + b"\xff" * 10,  # v2: overlong varint
], ids=lambda d: f"{len(d)}B")
def test_truncated_or_corrupt_header_raises_schema_error(data):
    with pytest.raises(SchemaError):
        parse_request_header(data)


@st.composite
def _hostile_headers(draw):
    if draw(st.booleans()):
        return draw(st.binary(max_size=40))
    # A real header (flexible or not) with random or truncated tagged fields / tail.
    key, version = draw(st.sampled_from(_all_versions()))
    data = encode_request_header(key, version, draw(st.integers(-(2**31), 2**31 - 1)),
                                 draw(st.none() | st.text(max_size=5)))
    if api(key).request_header_version(version) == 2:
        data = data[:-1]  # drop the empty tagged-field count; replace it with junk
    data += draw(st.binary(max_size=12))
    return data[:draw(st.integers(0, len(data)))]


@settings(max_examples=300, **SETTINGS)
@given(_hostile_headers())
def test_hostile_header_bytes_raise_only_schema_error(data):
    try:
        h, offset = parse_request_header(data)
    except SchemaError:
        return
    assert 8 <= offset <= len(data)


def _all_versions():
    from .protocol_strategies import API_KEYS
    return [(k, v) for k in API_KEYS for v in range(api(k).versions[0], api(k).versions[1] + 1)]


@pytest.mark.parametrize("key,version", _all_versions())
def test_request_header_version_and_roundtrip(key, version):
    a = api(key)
    expected = 2 if a.request.is_flexible(version) else 1
    assert a.request_header_version(version) == expected
    data = encode_request(key, version, 123, "client-1", {})
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    h, offset = parse_request_header(data[4:])
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.header_version) == (
        key, version, 123, "client-1", expected)
    assert a.request.decode(data[4 + offset:], version) == a.request.defaults(version)


@pytest.mark.parametrize("cls,key,version", [
    (MetadataRequest, 3, 0), (MetadataRequest, 3, 8), (MetadataRequest, 3, 9),
    (MetadataRequest, 3, 12), (ApiVersionsRequest, 18, 0), (ApiVersionsRequest, 18, 3),
    (ApiVersionsRequest, 18, 4), (DescribeGroupsRequest, 15, 4), (DescribeGroupsRequest, 15, 5),
])
@pytest.mark.parametrize("client_id", ["kafka-python-3", None, ""])
def test_request_header_matches_kafka_python(cls, key, version, client_id):
    """kafka-python's framed request (header + body) is byte-identical to canopy's, and
    canopy parses it."""
    body = api(key).request.defaults(version)
    if key == 3 and version == 0:
        body["topics"] = []
    obj = cls[version](**body)
    obj.with_header(correlation_id=31337, client_id=client_id)
    theirs = obj.encode(header=True, framed=True)
    assert theirs == encode_request(key, version, 31337, client_id, body)
    h, offset = parse_request_header(theirs[4:])
    assert (h.correlation_id, h.client_id) == (31337, client_id)
    assert api(key).request.decode(theirs[4 + offset:], version) == body


# --------------------------------------------------------------------------- response headers

def test_response_header_bytes():
    assert response_header(7, 0) == b"\x00\x00\x00\x07"
    assert response_header(7, 1) == b"\x00\x00\x00\x07\x00"


def test_parse_response_header_reads_tagged_fields():
    """canopy's clients find the body after a header v1's tagged fields, which another
    broker may send (KIP-482), not at a fixed offset; header v0 has none to read."""
    fetch_v12 = _size(42) + b"\x02" + b"\x00\x03abc" + b"\x07\x00" + b"BODY"
    assert parse_response_header(fetch_v12, 1, 12) == (42, 12)
    assert fetch_v12[12:] == b"BODY"
    assert parse_response_header(_size(42) + b"\x00BODY", 1, 12) == (42, 5)
    assert parse_response_header(_size(42) + b"\x02BODY", 18, 3) == (42, 4)   # ApiVersions: v0
    assert parse_response_header(_size(42) + b"BODY", 1, 11) == (42, 4)
    for cut in (b"\x00\x00", _size(42), _size(42) + b"\x01\x00\x05ab", _size(42) + b"\x01\x80"):
        with pytest.raises(SchemaError):
            parse_response_header(cut, 1, 12)


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_header_is_always_v0(version):
    body = {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}
    data = encode_response(99, 18, version, body)
    assert api(18).response_header_version(version) == 0
    assert data[:8] == _size(len(data) - 4) + _size(99)
    assert api(18).response.decode(data[8:], version)["api_keys"][0]["max_version"] == 4
    # kafka-python (which hard-codes the v0 response header for ApiVersions) agrees.
    got = ApiVersionsResponse.decode(data, version=version, header=True, framed=True)
    assert got.header.correlation_id == 99 and got.api_keys[0].max_version == 4


@pytest.mark.parametrize("key,version", _all_versions())
def test_response_header_version(key, version):
    a = api(key)
    flexible = a.response.is_flexible(version)
    expected = 0 if key == 18 else int(flexible)
    assert a.response_header_version(version) == expected
    data = encode_response(-5, key, version, {})
    header = response_header(-5, expected)
    assert data[4:4 + len(header)] == header
    assert a.response.decode(data[4 + len(header):], version) == a.response.defaults(version)


@pytest.mark.parametrize("version", [0, 8, 9, 12, 13])
def test_metadata_response_frame_readable_by_kafka_python(version):
    body = {"brokers": [{"node_id": 1, "host": "localhost", "port": 9092, "rack": None}],
            "controller_id": 1,
            "topics": [{"error_code": 0, "name": "t", "partitions": []}]}
    data = encode_response(4242, 3, version, body)
    got = MetadataResponse.decode(data, version=version, header=True, framed=True)
    assert got.header.correlation_id == 4242
    assert got.brokers[0].host == "localhost" and got.topics[0].name == "t"
