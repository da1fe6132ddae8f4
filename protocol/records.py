"""Kafka record batches, magic v2 (KIP-98) — the wire format *and* the on-disk format.

A record batch is a 61-byte header followed by the records section (possibly
compressed as one blob).  canopy treats batches as opaque bytes on the hot path:
Produce validates the header and CRC32C (``validate_batches``), the log patches
``baseOffset``/``partitionLeaderEpoch`` in place (the CRC covers bytes 21..end,
so neither patch needs a re-CRC) and Fetch ships the bytes with sendfile.
Records are only decoded (``iter_records``) where semantics need them: exact
timestamp lookup inside a batch, the broker's internal logs, and a produced batch
whose header maxTimestamp is visibly wrong (``max_timestamp_needs_recompute``:
-1 or below firstTimestamp), which gets the true maximum and a new CRC as Kafka's
LogValidator would give it.

Header layout (big endian), offsets from the start of the batch::

    0  baseOffset            int64
    8  batchLength           int32   bytes after this field: total = batchLength + 12
    12 partitionLeaderEpoch  int32
    16 magic                 int8    = 2
    17 crc                   uint32  CRC32C of bytes 21..end
    21 attributes            int16   bits 0-2 codec, 3 timestampType, 4 transactional, 5 control
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordsCount          int32
    61 records...

This module is sans-IO and imports nothing from other canopy packages.
"""

from __future__ import annotations

import struct
import time
from typing import Iterable, Iterator, NamedTuple, Sequence

import cramjam
import crc32c as _crc32c

_crc32c_fn = _crc32c.crc32c

__all__ = [
    "BATCH_HEADER_SIZE", "LOG_OVERHEAD", "MAGIC_V2",
    "BASE_OFFSET_OFFSET", "BATCH_LENGTH_OFFSET", "PARTITION_LEADER_EPOCH_OFFSET",
    "MAGIC_OFFSET", "CRC_OFFSET", "ATTRIBUTES_OFFSET", "LAST_OFFSET_DELTA_OFFSET",
    "BASE_TIMESTAMP_OFFSET", "MAX_TIMESTAMP_OFFSET", "PRODUCER_ID_OFFSET",
    "PRODUCER_EPOCH_OFFSET", "BASE_SEQUENCE_OFFSET", "RECORDS_COUNT_OFFSET",
    "CODEC_NONE", "CODEC_GZIP", "CODEC_SNAPPY", "CODEC_LZ4", "CODEC_ZSTD",
    "COMPRESSION_CODEC_MASK", "TIMESTAMP_TYPE_MASK", "TRANSACTIONAL_MASK", "CONTROL_MASK",
    "CREATE_TIME", "LOG_APPEND_TIME", "NO_TIMESTAMP",
    "CORRUPT_MESSAGE", "MESSAGE_TOO_LARGE", "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "UNSUPPORTED_COMPRESSION_TYPE", "INVALID_RECORD",
    "BatchHeader", "InvalidRecordBatch", "Record",
    "compute_crc", "check_batch", "split_batches", "validate_batches", "validate_produce_records",
    "patch_base_offset", "patch_leader_epoch", "set_log_append_time",
    "max_timestamp_needs_recompute", "record_max_timestamp", "record_timestamps",
    "set_create_time_max_timestamp",
    "iter_records", "decompress", "compress", "build_batch",
]

# ---------------------------------------------------------------------------
# Layout constants
# ---------------------------------------------------------------------------

BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21          # the CRC covers everything from here to the end
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
BATCH_HEADER_SIZE = 61
#: baseOffset + batchLength: the part of a batch not counted by batchLength.
LOG_OVERHEAD = 12
MAGIC_V2 = 2

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
assert HEADER_STRUCT.size == BATCH_HEADER_SIZE
_PREFIX_STRUCT = struct.Struct(">qiib")  # baseOffset, batchLength, leaderEpoch, magic
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
# KIP-534: the log cleaner set a delete horizon; firstTimestamp holds it (the records'
# timestamp deltas are relative to it, so their timestamps are unchanged).
DELETE_HORIZON_MASK = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1

# Kafka error codes a malformed batch maps to (values from Kafka's Errors enum).
CORRUPT_MESSAGE = 2                 # CorruptRecordException: bad CRC, lying length, truncation
MESSAGE_TOO_LARGE = 10              # RecordTooLargeException: batch > max.message.bytes
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43 # UnsupportedForMessageFormatException
UNSUPPORTED_COMPRESSION_TYPE = 76   # UnsupportedCompressionTypeException: codec 5..7
INVALID_RECORD = 87                 # InvalidRecordException: count/offset-range inconsistency

# Smallest legal batchLength: a header with zero records.
_MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD


class InvalidRecordBatch(Exception):
    """A batch failed validation; ``error_code`` is the Kafka error to answer with."""

    def __init__(self, message: str, error_code: int = CORRUPT_MESSAGE):
        super().__init__(message)
        self.error_code = error_code


def compute_crc(buf, pos: int = 0, end: int | None = None) -> int:
    """CRC32C (Castagnoli) over attributes..end of the batch starting at ``pos``."""
    mv = memoryview(buf)
    if end is None:
        end = pos + _INT32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)[0] + LOG_OVERHEAD
    return _crc32c.crc32c(mv[pos + ATTRIBUTES_OFFSET:end])


# ---------------------------------------------------------------------------
# Header view
# ---------------------------------------------------------------------------

class BatchHeader(NamedTuple):
    """The 61-byte v2 batch header, decoded with one ``struct.unpack_from``.

    A tuple (cheap to build: produce validates one per request).  ``position``
    is where the batch starts in the buffer it was parsed from — for a segment
    file, the file position.  A snapshot: patching the buffer later does not
    change an existing header.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @classmethod
    def parse(cls, buf, pos: int = 0) -> "BatchHeader":
        """Decode the header at ``pos``.  Raises InvalidRecordBatch(CORRUPT_MESSAGE)
        if fewer than 61 bytes are available.  Does not check magic or CRC."""
        if len(buf) - pos < BATCH_HEADER_SIZE:
            raise InvalidRecordBatch(
                f"record batch header truncated: {len(buf) - pos} bytes at position {pos}",
                CORRUPT_MESSAGE)
        return _make_header((*HEADER_STRUCT.unpack_from(buf, pos), pos))

    @property
    def total_size(self) -> int:
        """Bytes the whole batch occupies (header included)."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record; sequences wrap at int32 max (Kafka DefaultRecordBatch)."""
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


_make_header = BatchHeader._make


# ---------------------------------------------------------------------------
# Validation (header + CRC only: no per-record work)
# ---------------------------------------------------------------------------

def _check_one(buf, pos: int, end: int, strict: bool, check_crc: bool) -> BatchHeader:
    avail = end - pos
    if avail < BATCH_HEADER_SIZE:
        # Too short for a v2 header; say why as precisely as Kafka would.
        if avail >= MAGIC_OFFSET + 1:
            magic = _PREFIX_STRUCT.unpack_from(buf, pos)[3]
            if magic in (0, 1):
                raise InvalidRecordBatch(f"record batch magic {magic} is not 2", INVALID_RECORD)
        raise InvalidRecordBatch(f"truncated record batch at position {pos}", CORRUPT_MESSAGE)
    t = HEADER_STRUCT.unpack_from(buf, pos)
    # t: base_offset, batch_length, leader_epoch, magic, crc, attributes,
    #    last_offset_delta, base_ts, max_ts, producer_id, producer_epoch, base_seq, count
    magic = t[3]
    if magic != MAGIC_V2:
        # Produce v3+ (all canopy serves) may carry only magic-2 batches; Kafka's
        # ProduceRequest.validateRecords answers INVALID_RECORD for magic 0/1.  An
        # unknown future magic cannot even be framed: Kafka calls it corrupt.
        code = INVALID_RECORD if magic in (0, 1) else CORRUPT_MESSAGE
        raise InvalidRecordBatch(f"record batch magic {magic} is not 2", code)
    batch_length = t[1]
    if batch_length < _MIN_BATCH_LENGTH:
        raise InvalidRecordBatch(
            f"record batch length {batch_length} smaller than the v2 header", CORRUPT_MESSAGE)
    total = batch_length + LOG_OVERHEAD
    if total > avail:
        raise InvalidRecordBatch(
            f"record batch length {total} exceeds the {avail} bytes available", CORRUPT_MESSAGE)
    count = t[12]
    last_offset_delta = t[6]
    if count < 0 or last_offset_delta < 0:
        raise InvalidRecordBatch(
            f"invalid record count {count} / lastOffsetDelta {last_offset_delta}", INVALID_RECORD)
    if strict:
        # Kafka's LogValidator.validateBatch for produce: a client batch holds at
        # least one record and its offsets are dense (count == lastOffsetDelta+1).
        # Replicated batches may come from a compacted log, so followers skip this.
        if count == 0:
            raise InvalidRecordBatch("record batch holds no records", INVALID_RECORD)
        if count != last_offset_delta + 1:
            raise InvalidRecordBatch(
                f"inconsistent batch offset range ({last_offset_delta + 1}) and "
                f"record count ({count})", INVALID_RECORD)
    elif count > last_offset_delta + 1:
        raise InvalidRecordBatch(
            f"record count {count} exceeds offset range {last_offset_delta + 1}", INVALID_RECORD)
    if t[5] & COMPRESSION_CODEC_MASK > CODEC_ZSTD:
        raise InvalidRecordBatch(f"unknown compression codec {t[5] & COMPRESSION_CODEC_MASK}",
                                 UNSUPPORTED_COMPRESSION_TYPE)
    if check_crc:
        with memoryview(buf) as mv:
            crc = _crc32c_fn(mv[pos + ATTRIBUTES_OFFSET:pos + total])
        if crc != t[4]:
            raise InvalidRecordBatch(
                f"record batch CRC mismatch: stored {t[4]:#010x}, computed {crc:#010x}",
                CORRUPT_MESSAGE)
    return _make_header((*t, pos))


def check_batch(buf, pos: int = 0, end: int | None = None, *, strict: bool = True,
                check_crc: bool = True) -> BatchHeader:
    """Validate the one batch at ``pos`` (not extending past ``end``, default the
    buffer's end) and return its header; raises InvalidRecordBatch.  Used by the
    log's recovery to walk a segment tail."""
    return _check_one(buf, pos, len(buf) if end is None else end, strict, check_crc)


def validate_batches(buf, *, strict: bool = True, check_crc: bool = True) -> list[BatchHeader]:
    """Validate every batch in ``buf`` (batches back to back, nothing else) and
    return their headers.

    Checks per batch: magic 2, batchLength consistent with the buffer, counts
    non-negative, known codec and the CRC32C.  ``strict`` adds the rules Kafka
    applies to client-produced batches (count >= 1, count == lastOffsetDelta+1);
    pass ``strict=False`` for replicated data.  Raises InvalidRecordBatch.
    """
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    headers = []
    if end == 0:
        return headers
    while pos < end:
        h = _check_one(mv, pos, end, strict, check_crc)
        headers.append(h)
        pos += h.total_size
    return headers


def split_batches(buf, *, strict: bool = True, check_crc: bool = True) -> list[tuple[int, int]]:
    """Validate like ``validate_batches`` and return ``[(position, size), ...]``."""
    return [(h.position, h.total_size) for h in validate_batches(buf, strict=strict,
                                                                   check_crc=check_crc)]


def validate_produce_records(buf) -> BatchHeader:
    """Validate a Produce (v3+) partition's ``records`` field: exactly one v2 batch.

    Kafka's ProduceRequest.validateRecords rejects v3+ requests that hold no batch
    or more than one batch with INVALID_RECORD; canopy follows that rule, so the
    log appends exactly one batch per partition per request.
    """
    if buf is None or len(buf) == 0:
        raise InvalidRecordBatch("produce request holds no record batch", INVALID_RECORD)
    h = _check_one(buf, 0, len(buf), True, True)
    if h.batch_length + LOG_OVERHEAD == len(buf):
        return h
    headers = validate_batches(buf, strict=True)
    if len(headers) != 1:
        raise InvalidRecordBatch(
            f"produce requests v3+ must hold exactly one record batch, got {len(headers)}",
            INVALID_RECORD)
    return headers[0]


# ---------------------------------------------------------------------------
# In-place patches
# ---------------------------------------------------------------------------

def patch_base_offset(buf, pos: int, base_offset: int) -> None:
    """Overwrite baseOffset; outside the CRC'd range, so no re-CRC."""
    _INT64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)


def patch_leader_epoch(buf, pos: int, leader_epoch: int) -> None:
    """Overwrite partitionLeaderEpoch; outside the CRC'd range, so no re-CRC."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def set_log_append_time(buf, pos: int, ts_ms: int) -> None:
    """Stamp a batch with LogAppendTime (message.timestamp.type=LogAppendTime).

    Like Kafka's DefaultRecordBatch.setMaxTimestamp: set attribute bit 3,
    overwrite maxTimestamp, leave the records alone (readers take every record's
    timestamp from maxTimestamp for such batches) and recompute the CRC, since
    both fields are inside the CRC'd range.
    """
    attributes = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0]
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, ts_ms)
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos))


def recompress_batch(buf, codec: int, pos: int = 0) -> bytearray:
    """The batch at ``pos`` with its records section re-encoded with ``codec`` (a topic's
    compression.type other than ``producer``, as Kafka's LogValidator recompresses): the
    records are byte for byte the same, only the section's compression, the codec bits of
    the attributes, the batch length and the CRC change. librdkafka's raw snappy becomes
    xerial-framed snappy, which every client reads."""
    h, body = _batch_body(buf, pos)
    packed = compress(codec, bytes(body))
    out = bytearray(BATCH_HEADER_SIZE + len(packed))
    out[:BATCH_HEADER_SIZE] = bytes(memoryview(buf)[pos:pos + BATCH_HEADER_SIZE])
    out[BATCH_HEADER_SIZE:] = packed
    _INT32.pack_into(out, BATCH_LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
    _INT16.pack_into(out, ATTRIBUTES_OFFSET, (h.attributes & ~COMPRESSION_CODEC_MASK) | codec)
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0))
    return out


def max_timestamp_needs_recompute(h: BatchHeader) -> bool:
    """The cheap test deciding whether a CreateTime batch's header can be trusted.

    Kafka's LogValidator decodes every record and rewrites maxTimestamp (and the
    CRC) whenever the header disagrees with the records.  canopy keeps the
    per-record work off the hot path and only decodes when the header is visibly
    wrong: maxTimestamp -1 (sarama 1.22 never fills it in), maxTimestamp below
    firstTimestamp (impossible: the first record is one of the records), or the
    LogAppendTime bit set by a client on a CreateTime topic (Kafka resets it).
    A header that is wrong but plausible (max >= first) is taken as written.
    """
    return (h.max_timestamp < h.base_timestamp or h.max_timestamp == NO_TIMESTAMP
            or h.attributes & TIMESTAMP_TYPE_MASK != 0)


def _batch_body(buf, pos: int) -> tuple[BatchHeader, memoryview | bytes]:
    """The header of the batch at ``pos`` and its records section, decompressed."""
    mv = memoryview(buf)
    h = BatchHeader.parse(mv, pos)
    end = pos + h.total_size
    if end > len(mv):
        raise InvalidRecordBatch("record batch truncated", CORRUPT_MESSAGE)
    body = mv[pos + BATCH_HEADER_SIZE:end]
    if h.compression != CODEC_NONE:
        body = decompress(h.compression, body)
    return h, body


def _timestamp_deltas(buf, pos: int) -> tuple[BatchHeader, list[int]]:
    """The header and every record's timestampDelta of the batch at ``pos``, decoding
    only each record's length and delta.  Raises InvalidRecordBatch (CORRUPT_MESSAGE)
    when the records section does not decode."""
    h, body = _batch_body(buf, pos)
    n_body = len(body)
    p = 0
    deltas = []
    for _ in range(h.records_count):
        length, p = _read_varint(body, p)
        rec_end = p + length
        # 6 bytes: attributes, timestampDelta, offsetDelta, key, value, header count
        if length < 6 or rec_end > n_body:
            raise InvalidRecordBatch("record overruns the batch", CORRUPT_MESSAGE)
        deltas.append(_read_varint(body, p + 1)[0])   # after the attributes byte
        p = rec_end
    return h, deltas


def record_timestamps(buf, pos: int = 0) -> list[int]:
    """Every record's CreateTime timestamp (firstTimestamp + timestampDelta) in the
    batch at ``pos``; -1 for records without one (firstTimestamp -1, delta 0)."""
    h, deltas = _timestamp_deltas(buf, pos)
    base = h.base_timestamp
    if base == NO_TIMESTAMP:
        return [NO_TIMESTAMP if d == 0 else base + d for d in deltas]
    return [base + d for d in deltas]


def record_max_timestamp(buf, pos: int = 0) -> int:
    """The largest record timestamp of the batch at ``pos`` (see record_timestamps).

    Timestamps are read as CreateTime whatever the attributes say: this is the
    value the header should carry.  A batch whose records are all NO_TIMESTAMP
    gives -1.  Raises InvalidRecordBatch (CORRUPT_MESSAGE) when the records section
    does not decode.
    """
    stamps = record_timestamps(buf, pos)
    return max(stamps) if stamps else NO_TIMESTAMP


def set_create_time_max_timestamp(buf, pos: int, max_ts: int) -> bool:
    """Write ``max_ts`` as the batch's maxTimestamp with the CreateTime type, as
    Kafka's DefaultRecordBatch.setMaxTimestamp does after LogValidator computed
    it from the records: attributes and maxTimestamp rewritten, CRC recomputed
    (both fields are inside the CRC'd range).  Returns False, touching nothing,
    when the header already says exactly that."""
    attributes = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)[0]
    if not attributes & TIMESTAMP_TYPE_MASK and \
            _INT64.unpack_from(buf, pos + MAX_TIMESTAMP_OFFSET)[0] == max_ts:
        return False
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes & ~TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, max_ts)
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos))
    return True


# ---------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------

# xerial snappy-java's stream framing, written by the Java client and
# kafka-python: 8-byte magic, int32 version, int32 compat, then blocks of
# (int32 length, raw snappy).  librdkafka writes plain raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


def decompress(codec: int, data) -> bytes:
    """Decompress a records section written with ``codec``."""
    if codec == CODEC_NONE:
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            return bytes(cramjam.gzip.decompress(bytes(data)))
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(data)
        if codec == CODEC_LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == CODEC_ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except InvalidRecordBatch:
        raise
    except Exception as e:  # cramjam raises its own DecompressionError
        raise InvalidRecordBatch(f"cannot decompress codec {codec}: {e}", CORRUPT_MESSAGE) from e
    raise InvalidRecordBatch(f"unknown compression codec {codec}", UNSUPPORTED_COMPRESSION_TYPE)


def _snappy_decompress(data) -> bytes:
    mv = memoryview(data)
    # Detection as in kafka-python/Java: the 8-byte magic (version/compat are
    # ignored — some producers write them little-endian).
    if len(mv) > 16 and bytes(mv[:8]) == _XERIAL_MAGIC:
        out = bytearray()
        pos, end = 16, len(mv)
        while pos < end:
            if end - pos < 4:
                raise InvalidRecordBatch("truncated xerial snappy block", CORRUPT_MESSAGE)
            n = _INT32.unpack_from(mv, pos)[0]
            pos += 4
            if n < 0 or pos + n > end:
                raise InvalidRecordBatch("xerial snappy block overruns the batch", CORRUPT_MESSAGE)
            out += cramjam.snappy.decompress_raw(bytes(mv[pos:pos + n]))
            pos += n
        return bytes(out)
    return bytes(cramjam.snappy.decompress_raw(bytes(mv)))


def compress(codec: int, data: bytes, *, xerial: bool = True) -> bytes:
    """Compress a records section.  snappy defaults to xerial framing (what the
    Java client writes); ``xerial=False`` gives librdkafka's raw snappy.  lz4 is
    the LZ4 frame format with independent blocks — Kafka's Java
    KafkaLZ4BlockInputStream decodes each block on its own."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == CODEC_SNAPPY:
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(data))
        out = bytearray(_XERIAL_HEADER)
        mv = memoryview(data)
        for i in range(0, len(mv), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(bytes(mv[i:i + _XERIAL_BLOCK])))
            out += _INT32.pack(len(block))
            out += block
        return bytes(out)
    if codec == CODEC_LZ4:
        c = cramjam.lz4.Compressor(block_linked=False)
        c.compress(data)
        return bytes(c.finish())
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


# ---------------------------------------------------------------------------
# Records: varint (zigzag) encoding
# ---------------------------------------------------------------------------

class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list  # [(str, bytes | None)]


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """Zigzag varint/varlong (protobuf style), as Kafka's ByteUtils.readVarlong."""
    result = 0
    shift = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise InvalidRecordBatch("truncated varint in record", CORRUPT_MESSAGE) from None
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise InvalidRecordBatch("varint too long in record", CORRUPT_MESSAGE)


def _write_varint(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)  # zigzag for 64-bit
    v &= 0xFFFFFFFFFFFFFFFF
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(buf, pos)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise InvalidRecordBatch("record field overruns the batch", CORRUPT_MESSAGE)
    return bytes(buf[pos:end]), end


def iter_records(batch, pos: int = 0) -> Iterator[Record]:
    """Decode the records of the one batch at ``pos`` in ``batch``.

    Decompresses whole-batch compression; for LogAppendTime batches every
    record's timestamp is the batch's maxTimestamp (Kafka DefaultRecordBatch).
    """
    h, body = _batch_body(batch, pos)
    log_append_time = h.max_timestamp if h.timestamp_type == LOG_APPEND_TIME else None
    p = 0
    n_body = len(body)
    for _ in range(h.records_count):
        length, p = _read_varint(body, p)
        rec_end = p + length
        if length < 0 or rec_end > n_body:
            raise InvalidRecordBatch("record overruns the batch", CORRUPT_MESSAGE)
        p += 1  # record attributes: unused
        ts_delta, p = _read_varint(body, p)
        offset_delta, p = _read_varint(body, p)
        key, p = _read_bytes(body, p)
        value, p = _read_bytes(body, p)
        n_headers, p = _read_varint(body, p)
        headers = []
        for _ in range(n_headers):
            hk, p = _read_bytes(body, p)
            hv, p = _read_bytes(body, p)
            headers.append((hk.decode("utf-8") if hk is not None else "", hv))
        if p != rec_end:
            raise InvalidRecordBatch("record length does not match its fields", CORRUPT_MESSAGE)
        ts = log_append_time if log_append_time is not None else h.base_timestamp + ts_delta
        yield Record(h.base_offset + offset_delta, ts, key, value, headers)


class RecordSpan(NamedTuple):
    """One record of a decompressed records section, located but not copied: the
    cleaner keeps a record by copying ``body[start:end]`` verbatim (its offset and
    timestamp deltas stay relative to the batch's baseOffset and firstTimestamp)."""
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    tombstone: bool      # null value
    start: int
    end: int


def batch_records_section(buf, pos: int = 0) -> tuple[BatchHeader, memoryview | bytes]:
    """The header of the batch at ``pos`` and its records section, decompressed."""
    return _batch_body(buf, pos)


def record_spans(h: BatchHeader, body) -> list[RecordSpan]:
    """Every record of a records section (see batch_records_section), with its key,
    whether its value is null, and its byte range in ``body``.  The cleaner's inner loop
    (every record of a compacted log, twice per cleaning): one-byte varints, the common
    case, are decoded inline; plain tuples in RecordSpan's field order are returned."""
    out = []
    append = out.append
    p = 0
    n_body = len(body)
    for _ in range(h.records_count):
        start = p
        b = body[p] if p < n_body else 0x80
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            p += 1
        elif p + 1 < n_body and body[p + 1] < 0x80:     # two bytes: records of 64..8191 bytes
            v = (b & 0x7F) | (body[p + 1] << 7)
            length = (v >> 1) ^ -(v & 1)
            p += 2
        else:
            length, p = _read_varint(body, p)
        rec_end = p + length
        if length < 6 or rec_end > n_body:
            raise InvalidRecordBatch("record overruns the batch", CORRUPT_MESSAGE)
        q = p + 1                    # past the record attributes
        b = body[q]
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            q += 1
        else:
            ts_delta, q = _read_varint(body, q)
        b = body[q] if q < rec_end else 0x80
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            q += 1
        else:
            offset_delta, q = _read_varint(body, q)
        b = body[q] if q < rec_end else 0x80
        if b < 0x80:
            key_len = (b >> 1) ^ -(b & 1)
            q += 1
        else:
            key_len, q = _read_varint(body, q)
        if key_len < 0:
            key = None
        else:
            if q + key_len > rec_end:
                raise InvalidRecordBatch("record key overruns the record", CORRUPT_MESSAGE)
            key = bytes(body[q:q + key_len])
            q += key_len
        if q >= rec_end:
            raise InvalidRecordBatch("record overruns the batch", CORRUPT_MESSAGE)
        # the value length's sign is its zigzag encoding's lowest bit: null is -1
        append((offset_delta, ts_delta, key, bool(body[q] & 1), start, rec_end))
        p = rec_end
    return out


def rebase_record_timestamp(body, span: RecordSpan, delta_change: int) -> bytes:
    """The record at ``span`` of ``body`` with ``delta_change`` subtracted from its
    timestampDelta (the batch's firstTimestamp moved up by that much: the record's own
    timestamp stays the same)."""
    _, ts_delta, _, _, start, end = span
    _, p = _read_varint(body, start)           # record length
    attributes = body[p]
    _, q = _read_varint(body, p + 1)           # old timestampDelta
    rec = bytearray((attributes,))
    _write_varint(rec, ts_delta - delta_change)
    rec += body[q:end]
    out = bytearray()
    _write_varint(out, len(rec))
    out += rec
    return bytes(out)


def rebuild_batch(h: BatchHeader, records_section: bytes, records_count: int,
                  max_timestamp: int, *, base_timestamp: int | None = None,
                  attributes: int | None = None, xerial_snappy: bool = True) -> bytes:
    """A batch like ``h`` (same baseOffset, lastOffsetDelta, firstTimestamp, producer
    fields, attributes and codec) holding ``records_count`` records whose uncompressed
    bytes are ``records_section``; new batchLength, maxTimestamp and CRC. Keeping
    lastOffsetDelta is what Kafka's cleaner does for v2 batches: the batch still spans
    the producer's sequence range, so an idempotent producer's next batch follows on."""
    body = records_section
    if h.compression != CODEC_NONE:
        body = compress(h.compression, bytes(body), xerial=xerial_snappy)
    buf = bytearray(BATCH_HEADER_SIZE + len(body))
    HEADER_STRUCT.pack_into(
        buf, 0, h.base_offset, len(buf) - LOG_OVERHEAD, h.partition_leader_epoch, MAGIC_V2, 0,
        h.attributes if attributes is None else attributes, h.last_offset_delta,
        h.base_timestamp if base_timestamp is None else base_timestamp, max_timestamp,
        h.producer_id, h.producer_epoch, h.base_sequence, records_count)
    buf[BATCH_HEADER_SIZE:] = body
    _UINT32.pack_into(buf, CRC_OFFSET, compute_crc(buf, 0, len(buf)))
    return bytes(buf)


def _encode_record(out: bytearray, offset_delta: int, ts_delta: int, key, value,
                   headers: Iterable) -> None:
    body = bytearray(b"\x00")  # attributes
    _write_varint(body, ts_delta)
    _write_varint(body, offset_delta)
    for field in (key, value):
        if field is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(field))
            body += field
    headers = list(headers or ())
    _write_varint(body, len(headers))
    for hk, hv in headers:
        hk = hk.encode("utf-8") if isinstance(hk, str) else bytes(hk)
        _write_varint(body, len(hk))
        body += hk
        if hv is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(hv))
            body += hv
    _write_varint(out, len(body))
    out += body


def build_batch(records: Sequence, *, base_offset: int = 0, codec: int = CODEC_NONE,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                timestamp_type: int = CREATE_TIME, partition_leader_epoch: int = -1,
                is_transactional: bool = False, is_control: bool = False,
                xerial_snappy: bool = True) -> bytes:
    """Encode ``records`` — ``(key, value, headers, timestamp)`` tuples, timestamp
    None meaning now — into one v2 batch (used by tests and internal logs).

    Offsets are dense (offset delta = index).  Compressed output is kept even
    when larger than the input, so tests get the codec they asked for.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    now = None
    stamped = []
    for key, value, headers, ts in records:
        if ts is None:
            if now is None:
                now = int(time.time() * 1000)
            ts = now
        stamped.append((key, value, headers, ts))
    base_ts = stamped[0][3]
    max_ts = max(r[3] for r in stamped)
    body = bytearray()
    for i, (key, value, headers, ts) in enumerate(stamped):
        _encode_record(body, i, ts - base_ts, key, value, headers)
    if codec != CODEC_NONE:
        body = compress(codec, bytes(body), xerial=xerial_snappy)
    attributes = (codec & COMPRESSION_CODEC_MASK)
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    buf = bytearray(BATCH_HEADER_SIZE + len(body))
    HEADER_STRUCT.pack_into(
        buf, 0, base_offset, len(buf) - LOG_OVERHEAD, partition_leader_epoch, MAGIC_V2, 0,
        attributes, len(stamped) - 1, base_ts, max_ts, producer_id, producer_epoch,
        base_sequence, len(stamped))
    buf[BATCH_HEADER_SIZE:] = body
    _UINT32.pack_into(buf, CRC_OFFSET, compute_crc(buf, 0, len(buf)))
    return bytes(buf)
