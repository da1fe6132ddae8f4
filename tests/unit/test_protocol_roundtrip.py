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


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_hostile_bytes(case):
    key, version, kind = case
    schema = schema_for(key, kind)

    @st.composite
    def hostile(draw):
        how = draw(st.sampled_from(["random", "truncate", "mutate", "extend"]))
        if how == "random":
            return draw(st.binary(max_size=64))
        valid = schema.encode(draw(message_strategy(schema, version)), version)
        if how == "truncate":
            if not valid:
                return valid
            return valid[: draw(st.integers(0, len(valid) - 1))]
        if how == "extend":  # trailing garbage
            return valid + draw(st.binary(min_size=1, max_size=8))
        buf = bytearray(valid) or bytearray(b"\x00")
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, buf[i] ^ 0x01, buf[i] ^ 0x80]))
        return bytes(buf)

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(hostile())
    def check(data):
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
