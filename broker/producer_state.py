"""Idempotent-producer state per partition (Kafka's ProducerStateManager, cut to size).

Kafka's rules, which the clients' retry logic depends on:

* Per producer id, the broker remembers the metadata of the last five batches
  (``max.in.flight.requests.per.connection`` is capped at 5 for idempotent producers). A
  retried batch equal to one of those is answered with its *original* offsets and is
  not appended again.
* A batch must start at last sequence + 1 (wrapping at 2^31-1 to 0); anything else is
  OUT_OF_ORDER_SEQUENCE_NUMBER. A producer id with no state yet may start anywhere:
  its earlier batches may have been removed by retention.
* An epoch older than the one on record is fenced: INVALID_PRODUCER_EPOCH. A newer epoch
  must start again at sequence 0.

The state survives a restart through snapshots, Kafka's ``<offset>.snapshot`` files in
the partition directory: the table plus the partition's leader-epoch cache as they stood
with every batch below ``offset`` applied. The broker writes one when a segment rolls
(named by the new segment's base offset) and one at clean shutdown (named by the log end
offset); on start it loads the newest valid one and replays only the batch headers after
it (producer id, epoch and base sequence are in every v2 batch header). Without a usable
snapshot it replays every header in the log, as it did before snapshots existed.

Snapshot file (big-endian), its last four bytes a CRC32C of everything before them, so a
torn or damaged file is detected and skipped rather than trusted::

    magic "CNPS" | version int16 | offset int64
    epochs int32 | (leader_epoch int32, start_offset int64) * epochs
    producers int32 | (producer_id int64, producer_epoch int16, batches int8,
                       (first_seq int32, last_seq int32, base_offset int64,
                        last_offset int64, timestamp int64) * batches) * producers
    crc32c uint32
"""
from __future__ import annotations

import os
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import crc32c as _crc32c

from protocol.errors import ErrorCode

MAX_CACHED_BATCHES = 5
INT32_MAX = 0x7FFFFFFF


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class SequenceCheck:
    """Outcome of checking a batch against the producer state."""

    __slots__ = ("error", "duplicate")

    def __init__(self, error: ErrorCode = ErrorCode.NONE, duplicate: BatchMetadata | None = None):
        self.error = error
        self.duplicate = duplicate


_OK = SequenceCheck()


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


def _last_seq(first: int, count_minus_one: int) -> int:
    return (first + count_minus_one) % (INT32_MAX + 1)


class ProducerStateTable:
    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int) -> SequenceCheck:
        if producer_id < 0:
            return _OK
        entry = self.entries.get(producer_id)
        if entry is None:
            return _OK
        if epoch < entry.epoch:
            return SequenceCheck(ErrorCode.INVALID_PRODUCER_EPOCH)
        if epoch > entry.epoch:
            if first_seq != 0:
                return SequenceCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            return _OK
        last_seq = _last_seq(first_seq, last_offset_delta)
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return SequenceCheck(duplicate=b)
        if entry.batches and first_seq != _next_seq(entry.last_seq):
            return SequenceCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        return _OK

    def record(self, producer_id: int, epoch: int, first_seq: int, last_offset_delta: int,
               base_offset: int, timestamp: int) -> None:
        if producer_id < 0:
            return
        entry = self.entries.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = self.entries[producer_id] = ProducerEntry(epoch)
        entry.batches.append(BatchMetadata(first_seq, _last_seq(first_seq, last_offset_delta),
                                           base_offset, base_offset + last_offset_delta, timestamp))

    def rebuild(self, headers) -> None:
        """Replay batch headers (oldest first) from the log."""
        for h in headers:
            if h.producer_id >= 0 and not h.is_control:
                self.record(h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta,
                            h.base_offset, h.max_timestamp)

    def highest_producer_id(self) -> int:
        return max(self.entries, default=-1)


# -- snapshots -------------------------------------------------------------------------

SNAPSHOT_SUFFIX = ".snapshot"
_MAGIC = b"CNPS"
_VERSION = 1
_HEAD = struct.Struct(">4shq")
_COUNT = struct.Struct(">i")
_EPOCH = struct.Struct(">iq")
_PRODUCER = struct.Struct(">qhb")
_BATCH = struct.Struct(">iiqqq")
_CRC = struct.Struct(">I")


class SnapshotError(ValueError):
    """A snapshot file that cannot be trusted (torn, damaged, or not one of ours)."""


def encode_snapshot(offset: int, table: ProducerStateTable, epochs: list[tuple[int, int]]) -> bytes:
    out = bytearray(_HEAD.pack(_MAGIC, _VERSION, offset))
    out += _COUNT.pack(len(epochs))
    for epoch, start in epochs:
        out += _EPOCH.pack(epoch, start)
    out += _COUNT.pack(len(table.entries))
    for pid, entry in table.entries.items():
        out += _PRODUCER.pack(pid, entry.epoch, len(entry.batches))
        for b in entry.batches:
            out += _BATCH.pack(b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.timestamp)
    out += _CRC.pack(_crc32c.crc32c(bytes(out)))
    return bytes(out)


def decode_snapshot(data: bytes) -> tuple[int, ProducerStateTable, list[tuple[int, int]]]:
    """(offset, table, epoch cache entries); SnapshotError when the bytes are not a whole,
    undamaged snapshot."""
    if len(data) < _HEAD.size + 2 * _COUNT.size + _CRC.size:
        raise SnapshotError(f"{len(data)} bytes is too short for a snapshot")
    body, (crc,) = data[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if _crc32c.crc32c(body) != crc:
        raise SnapshotError("CRC mismatch")
    try:
        magic, version, offset = _HEAD.unpack_from(body, 0)
        if magic != _MAGIC or version != _VERSION:
            raise SnapshotError(f"not a version {_VERSION} snapshot")
        pos = _HEAD.size
        (n,) = _COUNT.unpack_from(body, pos)
        pos += _COUNT.size
        epochs = []
        for _ in range(n):
            epochs.append(_EPOCH.unpack_from(body, pos))
            pos += _EPOCH.size
        (n,) = _COUNT.unpack_from(body, pos)
        pos += _COUNT.size
        table = ProducerStateTable()
        for _ in range(n):
            pid, epoch, nb = _PRODUCER.unpack_from(body, pos)
            pos += _PRODUCER.size
            entry = table.entries[pid] = ProducerEntry(epoch)
            for _ in range(nb):
                entry.batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
    except struct.error as e:
        raise SnapshotError(f"truncated: {e}") from None
    if pos != len(body):
        raise SnapshotError(f"{len(body) - pos} bytes after the last producer")
    return offset, table, epochs


def snapshot_path(directory: Path, offset: int) -> Path:
    return Path(directory) / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in a partition directory, oldest first. Leftover
    temporary files of a write interrupted by a crash are removed on the way."""
    offsets = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return offsets   # a partition never written has no directory (storage/log.py)
    for name in names:
        if name.endswith(SNAPSHOT_SUFFIX) and name[:-len(SNAPSHOT_SUFFIX)].isdigit():
            offsets.append(int(name[:-len(SNAPSHOT_SUFFIX)]))
        elif name.endswith(SNAPSHOT_SUFFIX + ".tmp"):
            try:
                os.unlink(Path(directory) / name)
            except FileNotFoundError:
                pass
    return sorted(offsets)


def delete_snapshots(directory: Path, keep) -> None:
    """Remove every snapshot whose offset ``keep(offset)`` rejects."""
    for off in list_snapshots(directory):
        if not keep(off):
            try:
                os.unlink(snapshot_path(directory, off))
            except FileNotFoundError:
                pass
