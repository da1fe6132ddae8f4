"""maxTimestamp recomputation for batches whose header a client left wrong (issue 14).

sarama (<= 1.2x) sends maxTimestamp -1; Kafka's LogValidator computes the maximum from
the records and rewrites header and CRC. canopy does the same, but only for headers that
are visibly wrong, so well-formed batches keep the no-per-record-work path.
"""
import struct

import pytest
from hypothesis import given, settings, strategies as st

from protocol import records as R


def _with_max(batch: bytes, max_ts: int, *, attr_or: int = 0) -> bytearray:
    """A copy of ``batch`` with maxTimestamp (and optionally attribute bits) overwritten
    and a valid CRC: what a client that fills the header wrongly sends."""
    b = bytearray(batch)
    struct.pack_into(">q", b, R.MAX_TIMESTAMP_OFFSET, max_ts)
    attrs = struct.unpack_from(">h", b, R.ATTRIBUTES_OFFSET)[0] | attr_or
    struct.pack_into(">h", b, R.ATTRIBUTES_OFFSET, attrs)
    struct.pack_into(">I", b, R.CRC_OFFSET, R.compute_crc(b, 0))
    return b


@pytest.mark.parametrize("codec", [R.CODEC_NONE, R.CODEC_GZIP, R.CODEC_SNAPPY, R.CODEC_LZ4,
                                   R.CODEC_ZSTD])
def test_minus_one_header_gets_record_maximum_and_new_crc(codec):
    # Out of order on purpose: the maximum is in the middle, the first is not the least.
    stamps = [1_700_000_005_000, 1_700_000_001_000, 1_700_000_009_000, 1_700_000_003_000]
    good = R.build_batch([(b"k", b"v%d" % i, [], t) for i, t in enumerate(stamps)], codec=codec)
    bad = _with_max(good, -1)
    h = R.validate_produce_records(bytes(bad))
    assert R.max_timestamp_needs_recompute(h)
    assert R.record_max_timestamp(bad) == max(stamps)
    assert R.set_create_time_max_timestamp(bad, 0, max(stamps)) is True
    assert bytes(bad) == good                       # exactly the batch a correct client sends
    fixed = R.validate_produce_records(bytes(bad))  # CRC valid again
    assert fixed.max_timestamp == max(stamps)
    assert [r.timestamp for r in R.iter_records(bad)] == stamps


def test_header_below_first_timestamp_is_recomputed():
    stamps = [2_000, 5_000, 3_000]
    good = R.build_batch([(None, b"x", [], t) for t in stamps])
    h = R.BatchHeader.parse(_with_max(good, 1_000))
    assert R.max_timestamp_needs_recompute(h)
    assert R.record_max_timestamp(_with_max(good, 1_000)) == 5_000


def test_well_formed_headers_take_the_fast_path():
    for stamps in ([5], [5, 5], [1, 9, 4], [-1]):
        h = R.BatchHeader.parse(R.build_batch([(None, b"x", [], t) for t in stamps]))
        if stamps == [-1]:
            # records without timestamps: -1 is the right answer, computed (cheaply) once
            assert R.max_timestamp_needs_recompute(h)
            assert R.record_max_timestamp(R.build_batch([(None, b"x", [], -1)])) == -1
        else:
            assert not R.max_timestamp_needs_recompute(h), stamps


def test_set_is_a_no_op_when_the_header_is_already_right():
    good = bytearray(R.build_batch([(None, b"x", [], 10), (None, b"y", [], 20)]))
    before = bytes(good)
    assert R.set_create_time_max_timestamp(good, 0, 20) is False
    assert bytes(good) == before


def test_client_set_log_append_time_bit_is_cleared_on_create_time_topic():
    good = R.build_batch([(None, b"x", [], 10), (None, b"y", [], 20)])
    bad = _with_max(good, 20, attr_or=R.TIMESTAMP_TYPE_MASK)
    h = R.BatchHeader.parse(bad)
    assert R.max_timestamp_needs_recompute(h)
    assert R.set_create_time_max_timestamp(bad, 0, R.record_max_timestamp(bad)) is True
    assert bytes(bad) == good


def test_corrupt_records_section_is_corrupt_message():
    good = R.build_batch([(None, b"x" * 50, [], 10)], codec=R.CODEC_GZIP)
    bad = bytearray(good)
    bad[R.BATCH_HEADER_SIZE + 12:R.BATCH_HEADER_SIZE + 20] = b"\xff" * 8
    bad = _with_max(bad, -1)
    with pytest.raises(R.InvalidRecordBatch) as e:
        R.record_max_timestamp(bad)
    assert e.value.error_code == R.CORRUPT_MESSAGE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1 << 45), min_size=1, max_size=40),
       st.sampled_from([R.CODEC_NONE, R.CODEC_GZIP, R.CODEC_LZ4]))
def test_recomputed_maximum_matches_decoded_records(stamps, codec):
    batch = _with_max(R.build_batch([(None, b"v", [], t) for t in stamps], codec=codec), -1)
    assert R.record_max_timestamp(batch) == max(r.timestamp for r in R.iter_records(batch))
