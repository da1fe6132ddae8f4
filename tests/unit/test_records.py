"""protocol.records: the v2 record batch, cross-checked against kafka-python 3.0.12."""

import struct
import types

import cramjam
import pytest
from hypothesis import given, settings, strategies as st

import kafka.codec
import kafka.record.default_records as kdr
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol import records as R

CODECS = [R.CODEC_NONE, R.CODEC_GZIP, R.CODEC_SNAPPY, R.CODEC_LZ4, R.CODEC_ZSTD]


@pytest.fixture(autouse=True)
def kafka_python_codecs(monkeypatch):
    """kafka-python needs python-snappy/lz4/zstandard for codecs 2-4; they are not
    dependencies of canopy, so back kafka-python's own codec layer (its xerial
    framing code included) with cramjam's primitives."""
    monkeypatch.setattr(kafka.codec, "snappy", types.SimpleNamespace(
        compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b))),
        decompress=lambda b: bytes(cramjam.snappy.decompress_raw(bytes(b)))))

    def lz4_encode(b):
        c = cramjam.lz4.Compressor(block_linked=False)
        c.compress(bytes(b))
        return bytes(c.finish())

    monkeypatch.setattr(kafka.codec, "lz4", types.SimpleNamespace())
    monkeypatch.setattr(kdr, "lz4_encode", lz4_encode)
    monkeypatch.setattr(kdr, "lz4_decode", lambda b: bytes(cramjam.lz4.decompress(bytes(b))))
    monkeypatch.setattr(kafka.codec, "zstd", types.SimpleNamespace())
    monkeypatch.setattr(kdr, "zstd_encode", lambda b: bytes(cramjam.zstd.compress(bytes(b))))
    monkeypatch.setattr(kdr, "zstd_decode", lambda b: bytes(cramjam.zstd.decompress(bytes(b))))


def kp_build(recs, codec=0, producer_id=-1, producer_epoch=-1, base_sequence=-1):
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                  producer_id=producer_id, producer_epoch=producer_epoch,
                                  base_sequence=base_sequence, batch_size=1 << 30)
    for i, (k, v, h, ts) in enumerate(recs):
        assert b.append(i, timestamp=ts, key=k, value=v, headers=h) is not None
    return bytes(b.build())


def sample_records(n=50, base_ts=1_700_000_000_000):
    # compressible payloads so kafka-python keeps the codec
    return [(b"key-%d" % i if i % 3 else None, (b"value-%d-" % i) * 20,
             [("h", b"x"), ("n", None)] if i % 5 == 0 else [], base_ts + (i * 7919) % 1000)
            for i in range(n)]


def test_header_constants():
    assert R.HEADER_STRUCT.size == R.BATCH_HEADER_SIZE == 61
    b = R.build_batch([(b"k", b"v", [], 1234)], base_offset=77, partition_leader_epoch=5,
                      producer_id=9, producer_epoch=2, base_sequence=11)
    h = R.BatchHeader.parse(b)
    assert (h.base_offset, h.partition_leader_epoch, h.magic) == (77, 5, 2)
    assert h.total_size == len(b) == h.batch_length + 12
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count) == (9, 2, 11, 1)
    assert h.last_offset == 77 and h.base_timestamp == h.max_timestamp == 1234
    assert struct.unpack_from(">q", b, R.MAX_TIMESTAMP_OFFSET)[0] == 1234
    assert struct.unpack_from(">i", b, R.RECORDS_COUNT_OFFSET)[0] == 1


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_parse_with_ours(codec):
    recs = sample_records()
    raw = kp_build(recs, codec, producer_id=42, producer_epoch=1, base_sequence=100)
    [h] = R.validate_batches(raw)
    assert h.compression == codec
    assert h.records_count == len(recs) and h.last_offset_delta == len(recs) - 1
    assert h.max_timestamp == max(r[3] for r in recs)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 1, 100)
    got = list(R.iter_records(raw))
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == \
        [(i, k, v, h_, ts) for i, (k, v, h_, ts) in enumerate(recs)]


@pytest.mark.parametrize("codec", CODECS)
def test_our_batches_parse_with_kafka_python(codec):
    recs = sample_records()
    raw = R.build_batch(recs, base_offset=1000, codec=codec, producer_id=7, producer_epoch=0,
                        base_sequence=0)
    kb = DefaultRecordBatch(bytearray(raw))
    assert kb.validate_crc()
    assert kb.compression_type == codec
    assert kb.base_offset == 1000 and kb.last_offset == 1000 + len(recs) - 1
    got = list(kb)
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in got] == \
        [(1000 + i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(recs)]


def test_snappy_raw_and_xerial_both_decode():
    recs = sample_records(20)
    for xerial in (True, False):
        raw = R.build_batch(recs, codec=R.CODEC_SNAPPY, xerial_snappy=xerial)
        body = raw[R.BATCH_HEADER_SIZE:]
        assert body.startswith(b"\x82SNAPPY\x00") == xerial
        assert [r.value for r in R.iter_records(raw)] == [r[1] for r in recs]


def test_big_xerial_multi_block():
    recs = [(None, bytes(range(256)) * 1024, [], 5)] * 3  # > 32 KiB blocks
    raw = R.build_batch(recs, codec=R.CODEC_SNAPPY)
    assert [r.value for r in R.iter_records(raw)] == [r[1] for r in recs]
    assert [r.value for r in DefaultRecordBatch(bytearray(raw))] == [r[1] for r in recs]


def test_lz4_frame_independent_blocks():
    raw = R.build_batch([(None, b"a" * 300_000, [], 1)], codec=R.CODEC_LZ4)
    flg = raw[R.BATCH_HEADER_SIZE + 4]
    assert flg & 0x20, "Kafka's Java LZ4 reader needs block independence"


def test_patches_keep_crc_valid():
    raw = bytearray(R.build_batch(sample_records(5)))
    R.patch_base_offset(raw, 0, 123456789)
    R.patch_leader_epoch(raw, 0, 17)
    [h] = R.validate_batches(raw)
    assert h.base_offset == 123456789 and h.partition_leader_epoch == 17
    assert [r.offset for r in R.iter_records(raw)] == list(range(123456789, 123456794))
    assert DefaultRecordBatch(raw).validate_crc()


@pytest.mark.parametrize("codec", [0, 2])
def test_set_log_append_time(codec):
    raw = bytearray(b"junk" + R.build_batch(sample_records(5), codec=codec))
    R.set_log_append_time(raw, 4, 999)
    [h] = R.validate_batches(raw[4:])
    assert h.timestamp_type == R.LOG_APPEND_TIME and h.max_timestamp == 999
    assert {r.timestamp for r in R.iter_records(raw, 4)} == {999}
    kb = DefaultRecordBatch(bytearray(raw[4:]))
    assert kb.validate_crc() and {r.timestamp for r in kb} == {999}


def test_split_multiple_batches():
    a = R.build_batch(sample_records(3))
    b = R.build_batch(sample_records(4), codec=R.CODEC_GZIP)
    assert R.split_batches(a + b) == [(0, len(a)), (len(a), len(b))]
    assert R.split_batches(b"") == []
    with pytest.raises(R.InvalidRecordBatch) as e:
        R.validate_produce_records(a + b)
    assert e.value.error_code == R.INVALID_RECORD
    with pytest.raises(R.InvalidRecordBatch) as e:
        R.validate_produce_records(b"")
    assert e.value.error_code == R.INVALID_RECORD
    assert R.validate_produce_records(memoryview(a)).records_count == 3


def _err(buf, **kw):
    with pytest.raises(R.InvalidRecordBatch) as e:
        R.validate_batches(buf, **kw)
    return e.value.error_code


def test_validation_errors():
    good = R.build_batch(sample_records(3))
    # bad CRC
    bad = bytearray(good); bad[-1] ^= 1
    assert _err(bad) == R.CORRUPT_MESSAGE
    # truncated batch / lying length
    assert _err(good[:-1]) == R.CORRUPT_MESSAGE
    assert _err(good[:30]) == R.CORRUPT_MESSAGE
    assert _err(good + b"\x00" * 5) == R.CORRUPT_MESSAGE
    lying = bytearray(good); struct.pack_into(">i", lying, 8, 10)
    assert _err(lying) == R.CORRUPT_MESSAGE
    # magic
    m1 = bytearray(good); m1[16] = 1
    assert _err(m1) == R.INVALID_RECORD
    m3 = bytearray(good); m3[16] = 3
    assert _err(m3) == R.CORRUPT_MESSAGE
    # negative count / inconsistent count (re-CRC so only that rule fires)
    for field, value in ((R.RECORDS_COUNT_OFFSET, -1), (R.RECORDS_COUNT_OFFSET, 2),
                         (R.LAST_OFFSET_DELTA_OFFSET, -1)):
        x = bytearray(good); struct.pack_into(">i", x, field, value)
        struct.pack_into(">I", x, R.CRC_OFFSET, R.compute_crc(x))
        assert _err(x) == R.INVALID_RECORD
    # fewer records than offsets is legal in replicated (compacted) data only
    x = bytearray(good); struct.pack_into(">i", x, R.RECORDS_COUNT_OFFSET, 2)
    struct.pack_into(">I", x, R.CRC_OFFSET, R.compute_crc(x))
    R.validate_batches(x, strict=False)
    # unknown codec
    x = bytearray(good); struct.pack_into(">h", x, R.ATTRIBUTES_OFFSET, 6)
    struct.pack_into(">I", x, R.CRC_OFFSET, R.compute_crc(x))
    assert _err(x) == R.UNSUPPORTED_COMPRESSION_TYPE


def test_corrupt_compressed_body_raises_invalid():
    raw = bytearray(R.build_batch(sample_records(3), codec=R.CODEC_ZSTD))
    raw[R.BATCH_HEADER_SIZE + 6] ^= 0xFF
    with pytest.raises(R.InvalidRecordBatch):
        list(R.iter_records(raw))


headers_st = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8))),
                      max_size=3)
record_st = st.tuples(st.one_of(st.none(), st.binary(max_size=30)),
                      st.one_of(st.none(), st.binary(max_size=200)),
                      headers_st,
                      st.integers(min_value=0, max_value=2**45))


@settings(max_examples=150, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.sampled_from(CODECS),
       st.integers(min_value=0, max_value=2**62))
def test_round_trip_property(recs, codec, base_offset):
    raw = R.build_batch(recs, codec=codec, base_offset=base_offset)
    [h] = R.validate_batches(raw)
    assert h.max_timestamp == max(r[3] for r in recs)
    got = list(R.iter_records(raw))
    assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == [tuple(r) for r in recs]
    assert [r.offset for r in got] == list(range(base_offset, base_offset + len(recs)))
    kb = DefaultRecordBatch(bytearray(raw))
    assert kb.validate_crc()
    assert [(r.key, r.value, r.timestamp) for r in kb] == [(k, v, ts) for k, v, _, ts in recs]


def test_recompress_batch_keeps_records_and_header_fields():
    from protocol.records import (CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, BatchHeader,
                                  build_batch, check_batch, iter_records, recompress_batch)
    recs = [(b"k%d" % i, b"v%d" % i * 10, [("h", b"x")], 1_700_000_000_000 + i) for i in range(20)]
    for src in (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY):
        batch = build_batch(recs, producer_id=7, producer_epoch=1, base_sequence=40, codec=src,
                            xerial_snappy=False)
        before = BatchHeader.parse(batch)
        for dst in (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD):
            out = recompress_batch(batch, dst)
            h = check_batch(out)   # length and CRC are right
            assert h.compression == dst
            assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count, h.base_timestamp,
                    h.max_timestamp, h.last_offset_delta) == \
                (before.producer_id, before.producer_epoch, before.base_sequence, before.records_count,
                 before.base_timestamp, before.max_timestamp, before.last_offset_delta)
            assert [(r.key, r.value, r.timestamp) for r in iter_records(out)] == \
                [(r.key, r.value, r.timestamp) for r in iter_records(batch)]
