"""protocol.schema: every (API, version, request/response) under test round-trips, and
hostile bytes fail only with SchemaError.

Values come from strategies generated from the same JSON schemas (protocol_strategies),
so every field a version has is exercised with in-range, edge and null values.
"""
from __future__ import annotations

import os
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from protocol.messages import api
from protocol.schema import SchemaError, uvarint_bytes

from .protocol_strategies import case_id, message_cases, message_strategy, schema_for

CASES = message_cases()
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
# Examples per (API, version, direction): 322 cases keep the whole file ~15 s at the default;
# raise it for a deeper soak (CANOPY_PROTOCOL_EXAMPLES=500 pytest ...).
EXAMPLES = int(os.environ.get("CANOPY_PROTOCOL_EXAMPLES", "10"))


def test_every_version_is_covered():
    # 22 APIs; fails loudly if messages.py changes a version range without this suite noticing.
    assert {k for k, _, _ in CASES} == {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18,
                                         19, 20, 21, 22, 23, 32, 37, 60}
    assert api(0).versions[0] == 0  # Produce widened below kafka's 3


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_roundtrip(case):
    key, version, kind = case
    schema = schema_for(key, kind)

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(message_strategy(schema, version))
    def check(msg):
        data = schema.encode(msg, version)
        assert schema.decode(data, version) == msg
        # Encoding is deterministic and canonical: re-encoding the decoded dict is byte-identical.
        assert schema.encode(schema.decode(data, version), version) == data

    check()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_defaults_roundtrip(case):
    """An empty dict encodes as the all-defaults message, which decodes to .defaults()."""
    key, version, kind = case
    schema = schema_for(key, kind)
    defaults = schema.defaults(version)
    assert schema.decode(schema.encode({}, version), version) == defaults
    assert schema.encode(defaults, version) == schema.encode({}, version)


# --------------------------------------------------------------------------- hostile bytes

def _decode_hostile(schema, data, version):
    """Decoding must either succeed or raise SchemaError: nothing else, and fast."""
    start = time.perf_counter()
    try:
        schema.decode(data, version)
    except SchemaError:
        pass
    assert time.perf_counter() - start < 1.0


def _corruptions(valid: bytes, rnd) -> list[bytes]:
    """Hostile variants of one valid encoding: a truncation, flipped/extreme bytes (which
    turn lengths and counts into lies), trailing garbage, and plain random bytes."""
    out = []
    if valid:
        out.append(valid[: rnd.randrange(len(valid))])
    buf = bytearray(valid) or bytearray(b"\x00")
    for _ in range(rnd.randint(1, 4)):
        i = rnd.randrange(len(buf))
        buf[i] = rnd.choice([0x00, 0xFF, 0x7F, 0x80, buf[i] ^ 0x01, buf[i] ^ 0x80])
    out.append(bytes(buf))
    out.append(valid + rnd.randbytes(rnd.randint(1, 8)))
    out.append(rnd.randbytes(rnd.randint(0, 64)))
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hostile_bytes(case):
    key, version, kind = case
    schema = schema_for(key, kind)

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(message_strategy(schema, version), st.randoms(use_true_random=False))
    def check(msg, rnd):
        for data in _corruptions(schema.encode(msg, version), rnd):
            _decode_hostile(schema, data, version)

    check()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_trailing_bytes_rejected(case):
    key, version, kind = case
    schema = schema_for(key, kind)
    with pytest.raises(SchemaError):
        schema.decode(schema.encode({}, version) + b"\x00", version)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_truncation_of_defaults_rejected(case):
    key, version, kind = case
    schema = schema_for(key, kind)
    data = schema.encode({}, version)
    for n in range(len(data)):
        with pytest.raises(SchemaError):
            schema.decode(data[:n], version)


LYING_COUNTS = [2**31 - 1, 2**30, 0x7FFFFFFE]


@pytest.mark.parametrize("count", LYING_COUNTS)
@pytest.mark.parametrize("flexible", [False, True])
def test_lying_array_count_does_not_allocate(count, flexible):
    """A request claiming ~2 billion topics in a 30-byte body must fail at once, without
    building a list (or anything else) sized by the claim."""
    metadata = api(3).request
    version = 12 if flexible else 4
    assert metadata.is_flexible(version) == flexible
    prefix = uvarint_bytes(count + 1) if flexible else count.to_bytes(4, "big")
    body = prefix + b"\x00" * 30
    tracemalloc.start()
    try:
        with pytest.raises(SchemaError):
            metadata.decode(body, version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("flexible", [False, True])
def test_lying_bytes_length_does_not_allocate(flexible):
    """Same for a bytes field (Produce records) claiming 2 GiB."""
    produce = api(0).request
    version = 9 if flexible else 8
    # transactional_id null, acks, timeout, one topic "t", one partition 0, then records.
    if flexible:
        body = (b"\x00" + b"\xff\xff" + b"\x00\x00\x00\x00" + b"\x02" + b"\x02t" + b"\x02"
                + b"\x00\x00\x00\x00" + uvarint_bytes(2**31 - 1) + b"\x00" * 8)
    else:
        body = (b"\xff\xff" + b"\xff\xff" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x01"
                + b"\x00\x01t" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x00"
                + b"\x7f\xff\xff\xff" + b"\x00" * 8)
    tracemalloc.start()
    try:
        with pytest.raises(SchemaError):
            produce.decode(body, version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_overlong_varint_rejected():
    with pytest.raises(SchemaError):
        api(3).request.decode(b"\xff" * 64, 12)


def test_invalid_utf8_rejected():
    # Metadata v4: one topic whose name is the 2 bytes ff fe, then allow_auto_topic_creation.
    with pytest.raises(SchemaError):
        api(3).request.decode(b"\x00\x00\x00\x01\x00\x02\xff\xfe\x01", 4)


def test_null_for_non_nullable_rejected():
    # Metadata v0 topics are not nullable (v1+ null means "all topics").
    with pytest.raises(SchemaError):
        api(3).request.decode(b"\xff\xff\xff\xff", 0)
    assert api(3).request.decode(b"\xff\xff\xff\xff\x01", 4)["topics"] is None


# --------------------------------------------------------------------------- details

def test_unknown_tagged_fields_are_skipped():
    """Newer clients may send tags canopy's schema does not know; Kafka skips them."""
    schema = api(3).request
    known = schema.encode({"topics": [{"name": "t"}]}, 12)
    assert known.endswith(b"\x00")  # empty top-level tagged-field section
    with_unknown = known[:-1] + b"\x02" + b"\x07\x03xyz" + b"\x63\x00"  # tags 7 and 99
    assert schema.decode(with_unknown, 12) == schema.decode(known, 12)


def test_tagged_field_written_only_when_not_default():
    schema = api(1).request  # FetchRequest v12+: cluster_id is tag 0, default null
    without = schema.encode({"cluster_id": None}, 12)
    with_ = schema.encode({"cluster_id": "c"}, 12)
    assert len(with_) == len(without) + 4  # tag 0, size 2, compact string "c"
    assert schema.decode(with_, 12)["cluster_id"] == "c"


def test_decode_accepts_bytes_like():
    schema = api(3).request
    data = schema.encode({"topics": [{"name": "t"}]}, 4)
    assert schema.decode(memoryview(data), 4) == schema.decode(bytearray(data), 4) == \
        schema.decode(data, 4)


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_encode_external_splices_to_the_same_bytes(version):
    """Fetch responses leave record bytes out (ExternalBytes) so they can be sendfile'd;
    splicing them back in at the reported positions must give exactly what encoding the
    bytes inline gives, in classic and compact encodings."""
    from protocol.schema import ExternalBytes

    schema = api(1).response
    blobs = [b"A" * 5, b"", b"B" * 300]  # 300: a 2-byte uvarint length when compact

    def body(records):
        return {"responses": [{"topic": "t", "topic_id": uuid_for(version), "partitions": [
            {"partition_index": i, "records": r} for i, r in enumerate(records)]}]}

    inline = schema.encode(body(blobs), version)
    externals = [ExternalBytes(len(b), source=b) for b in blobs]
    data, positions = schema.encode_external(body(externals), version)
    assert [ext for _, ext in positions] == externals
    out, prev = bytearray(), 0
    for pos, ext in positions:
        out += data[prev:pos] + ext.source
        prev = pos
    out += data[prev:]
    assert bytes(out) == inline
    assert len(data) + sum(map(len, blobs)) == len(inline)


def uuid_for(version):
    import uuid
    return uuid.UUID(int=7) if version >= 13 else uuid.UUID(int=0)


@pytest.mark.parametrize("key,version,body", [
    (12, 0, {"generation_id": 2**31}),                       # int32 overflow
    (12, 0, {"generation_id": "1"}),                         # wrong type
    (3, 0, {"topics": None}),                                # null, not nullable in v0
    (3, 4, {"topics": [{"name": 7}]}),                       # string field given an int
    (3, 12, {"topics": [{"name": "t", "topic_id": "x"}]}),   # uuid given a str
    (3, 12, {"topics": ["t"]}),                              # struct given a str
    (0, 9, {"topic_data": [{"name": "t", "partition_data": [{"records": "text"}]}]}),
    (19, 7, {"topics": [{"name": "\ud800"}]}),               # lone surrogate: not UTF-8
    (3, 4, {"topics": [{"name": "x" * 40000}]}),             # longer than int16 allows
], ids=lambda x: repr(x)[:40])
def test_bad_values_raise_schema_error_on_encode(key, version, body):
    with pytest.raises(SchemaError):
        api(key).request.encode(body, version)


def test_out_of_range_number_in_an_array_is_a_schema_error():
    """Arrays of numbers are packed in one call; a value that does not fit is still a
    SchemaError, as for a single field."""
    metadata = api(3).response
    for version in (1, 12):
        metadata.encode({"topics": [{"name": "t", "partitions": [{"replica_nodes": [0, 1]}]}]}, version)
        with pytest.raises(SchemaError):
            metadata.encode({"topics": [{"name": "t", "partitions": [{"replica_nodes": [0, 2**31]}]}]}, version)
