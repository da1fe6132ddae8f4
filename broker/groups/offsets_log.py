"""Committed offsets: the in-memory table and its durable form in ``__consumer_offsets``.

Every OffsetCommit appends one record per partition to a partition of the internal topic
``__consumer_offsets`` (a compacted log, as in Kafka: the cleaner keeps the latest record
per key, so the topic stays bounded by the live offsets plus one segment) and is
answered only once the flush policy says the batch is durable. On start the log is
replayed from its start offset; the last record for a key wins, so the table after replay
equals the table before the restart.

Record format (canopy's own, compact; all integers big-endian; Kafka's internal schema is
not reused because nothing outside canopy reads this topic):

    key   = u8  type (1 = committed offset)
            u16 len + group id (UTF-8)
            u16 len + topic name (UTF-8)
            i32 partition
    value = u8  version (0)
            i64 committed offset
            i32 committed leader epoch (-1 unknown)
            i64 commit timestamp (ms since the epoch)
            i32 len + metadata (UTF-8), len -1 = null metadata
    value = null (tombstone): the committed offset was deleted

Records of an unknown key type or value version are skipped on replay (forward
compatibility: a newer canopy may add record types, e.g. group metadata).
"""
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

from protocol.records import InvalidRecordBatch, iter_records, validate_batches

log = logging.getLogger("canopy.groups")

OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's offsets topic is compacted (cleanup.policy=compact, offsets.topic.segment.bytes):
# the log cleaner (storage/cleaner.py) keeps the newest record per (group, topic,
# partition) key and drops deleted offsets' tombstones after delete.retention.ms.
# Offsets topics created by canopy before compaction existed keep their old configs and
# the coordinator's snapshot compaction (coordinator.maybe_compact).


def offsets_topic_configs(replication_factor: int, segment_bytes: int = 16 << 20) -> dict[str, str]:
    """Replicated, a commit must reach two replicas before it is acknowledged, so any one
    broker can be lost with its disk (Kafka recommends min.insync.replicas=2 for the
    offsets topic)."""
    return {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes),
            "min.insync.replicas": str(min(2, replication_factor))}


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around), which Kafka uses to
    place a group: the same group lands on the same partition number as in Kafka."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's GroupMetadataManager.partitionFor: Utils.abs(hashCode) % partitions
    (Utils.abs maps Integer.MIN_VALUE to 0)."""
    if partitions <= 1:
        return 0
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions

KEY_OFFSET = 1
VALUE_V0 = 0
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_VALUE_FIXED = struct.Struct(">Bqiqi")   # version, offset, leader epoch, timestamp, md len

# Kafka's offset.metadata.max.bytes default.
MAX_METADATA_BYTES = 4096


@dataclass(frozen=True)
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise ValueError("name longer than 65535 bytes")
    return _U16.pack(len(b)) + b


def encode_key(group_id: str, topic: str, partition: int) -> bytes:
    return bytes([KEY_OFFSET]) + _str(group_id) + _str(topic) + _I32.pack(partition)


def decode_key(key: bytes) -> tuple[str, str, int] | None:
    if not key or key[0] != KEY_OFFSET:
        return None
    pos = 1
    out = []
    for _ in range(2):
        (n,) = _U16.unpack_from(key, pos)
        pos += 2
        out.append(key[pos:pos + n].decode("utf-8"))
        pos += n
    (partition,) = _I32.unpack_from(key, pos)
    if pos + 4 != len(key):
        raise ValueError("trailing bytes in offset key")
    return out[0], out[1], partition


def encode_value(e: OffsetEntry) -> bytes:
    if e.metadata is None:
        return _VALUE_FIXED.pack(VALUE_V0, e.offset, e.leader_epoch, e.commit_timestamp, -1)
    md = e.metadata.encode("utf-8")
    return _VALUE_FIXED.pack(VALUE_V0, e.offset, e.leader_epoch, e.commit_timestamp, len(md)) + md


def decode_value(value: bytes) -> OffsetEntry | None:
    if value[0] != VALUE_V0:
        return None
    _, offset, epoch, ts, n = _VALUE_FIXED.unpack_from(value, 0)
    if n < 0:
        md = None
    else:
        md = value[_VALUE_FIXED.size:_VALUE_FIXED.size + n].decode("utf-8")
        if len(value) != _VALUE_FIXED.size + n:
            raise ValueError("offset value length mismatch")
    return OffsetEntry(offset, epoch, md, ts)


class OffsetTable:
    """group id -> {(topic, partition): OffsetEntry}."""

    def __init__(self):
        self.groups: dict[str, dict[tuple[str, int], OffsetEntry]] = {}

    def get(self, group_id: str, topic: str, partition: int) -> OffsetEntry | None:
        return self.groups.get(group_id, {}).get((topic, partition))

    def of_group(self, group_id: str) -> dict[tuple[str, int], OffsetEntry]:
        return self.groups.get(group_id, {})

    def put(self, group_id: str, topic: str, partition: int, entry: OffsetEntry | None) -> None:
        if entry is None:
            g = self.groups.get(group_id)
            if g is not None:
                g.pop((topic, partition), None)
                if not g:
                    del self.groups[group_id]
        else:
            self.groups.setdefault(group_id, {})[(topic, partition)] = entry

    def apply_record(self, key: bytes | None, value: bytes | None) -> bool:
        """Apply one log record; False when it is not an offset record we know."""
        if key is None:
            return False
        k = decode_key(key)
        if k is None:
            return False
        if value is None:
            self.put(*k, None)
            return True
        entry = decode_value(value)
        if entry is None:
            return False
        self.put(*k, entry)
        return True

    def replay(self, log_, chunk_bytes: int = 4 << 20) -> int:
        """Rebuild the table from a storage.Log; returns the number of records applied."""
        applied = skipped = 0
        offset = log_.log_start_offset
        while offset < log_.log_end_offset:
            with log_.read(offset, chunk_bytes) as rr:
                if not rr:
                    break
                buf = rr.read_bytes()
            next_offset = offset
            for h in validate_batches(buf, strict=False, check_crc=False):
                next_offset = max(next_offset, h.next_offset)
                try:
                    records = list(iter_records(buf, h.position))
                except InvalidRecordBatch as e:
                    log.warning("skipping unreadable batch at offset %d of %s: %s",
                                h.base_offset, OFFSETS_TOPIC, e)
                    continue
                for rec in records:
                    if rec.offset < offset:
                        continue   # the first batch may start before the read offset
                    try:
                        if self.apply_record(rec.key, rec.value):
                            applied += 1
                        else:
                            skipped += 1
                    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
                        skipped += 1
                        log.warning("skipping malformed record at offset %d of %s: %s",
                                    rec.offset, OFFSETS_TOPIC, e)
            if next_offset <= offset:
                break
            offset = next_offset
        if skipped:
            log.warning("%s replay skipped %d record(s)", OFFSETS_TOPIC, skipped)
        return applied
