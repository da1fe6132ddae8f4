"""Numbers both /metrics and the status page derive from the broker's state: which
partitions are under-replicated, replica and consumer lag in records and in time."""
from __future__ import annotations

import time

from ..broker import monotonic_ms


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def min_insync(broker, p) -> int:
    try:
        return int(p.topic.configs.get("min.insync.replicas", broker.config.min_insync_replicas))
    except ValueError:
        return broker.config.min_insync_replicas


def is_under_replicated(broker, p) -> bool:
    """A partition led here is under-replicated when a direct child (an ISR candidate) is
    out of the committed ISR, or any replica of its tree is not a live broker. (Kafka's
    rule, ISR smaller than the replica set, would call every tree deeper than one tier
    under-replicated: only the leader's children can be in the ISR.)"""
    isr = set(p.committed_isr)
    if any(c not in isr for c in p.children):
        return True
    return any(not broker.is_alive(r) for r in p.replicas)


def newest_timestamp(p) -> int:
    lg = p.log
    return lg.max_timestamp_through(lg.log_end_offset - 1) if lg.log_end_offset > lg.log_start_offset else -1


def time_lag_ms(p, upto: int, newest: int | None = None) -> int:
    """How far behind, in record time, a reader (replica or consumer) that holds the log
    below ``upto`` is: the newest timestamp of this log minus the newest timestamp below
    ``upto``, from the timestamp index (no record is decoded). 0 when nothing is missing."""
    lg = p.log
    end = lg.log_end_offset
    if upto >= end:
        return 0
    if newest is None:
        newest = newest_timestamp(p)
    if newest < 0:
        return 0
    if upto <= lg.log_start_offset:
        # Nothing of the retained log is held: as old as the oldest retained record.
        held = lg.max_timestamp_through(lg.log_start_offset) if end > lg.log_start_offset else newest
        return max(0, now_ms() - held) if held >= 0 else 0
    held = lg.max_timestamp_through(upto - 1)
    return max(0, newest - held) if held >= 0 else 0


def children_view(p) -> dict[int, dict]:
    """What a replica knows of its children in the tree: the offset each last fetched at
    (everything below it is theirs), lag behind this replica's log, last fetch age."""
    out = {}
    now = monotonic_ms()
    end = p.log.log_end_offset
    newest = newest_timestamp(p)
    for c in p.children:
        seen = p.downstream_fetches.get(c)
        if seen is None:
            out[c] = {"log_end_offset": None, "lag_records": None, "lag_seconds": None,
                      "last_fetch_age_ms": None}
            continue
        offset, at_ms = seen
        out[c] = {"log_end_offset": offset, "lag_records": max(0, end - offset),
                  "lag_seconds": time_lag_ms(p, offset, newest) / 1000, "last_fetch_age_ms": now - at_ms}
    return out


def coordinated_groups(broker) -> list:
    """Groups this broker coordinates (leads their __consumer_offsets partition)."""
    coord = broker.groups
    names = set(coord.groups) | set(coord.offsets.groups)
    return sorted(n for n in names if coord.coordinator_error(n) == 0)


def group_offsets(broker, group_id: str) -> list[dict]:
    """Per partition the group committed: committed offset, lag in records and seconds
    (against this broker's replica of the partition; None when it holds none)."""
    out = []
    for (topic, index), entry in sorted(broker.groups.offsets.of_group(group_id).items()):
        p = broker.topics.partition(topic, index)
        row = {"topic": topic, "partition": index, "committed_offset": entry.offset,
               "lag_records": None, "lag_seconds": None}
        if p is not None and p.is_replica:
            hw = p.high_watermark
            row["lag_records"] = max(0, hw - entry.offset)
            row["lag_seconds"] = time_lag_ms(p, max(entry.offset, 0)) / 1000 if entry.offset < hw else 0.0
        out.append(row)
    return out


def decode_assignment(data: bytes) -> list[tuple[str, list[int]]]:
    """The consumer protocol's assignment (ConsumerProtocolAssignment v0-v3: int16
    version, [topic string, [int32 partition]], user data): what each member reads.
    Non-consumer groups (Connect, ...) or damaged bytes give []."""
    try:
        mv = memoryview(data)
        pos = 2
        n = int.from_bytes(mv[pos:pos + 4], "big", signed=True)
        pos += 4
        out = []
        for _ in range(max(n, 0)):
            ln = int.from_bytes(mv[pos:pos + 2], "big", signed=True)
            pos += 2
            name = bytes(mv[pos:pos + ln]).decode("utf-8")
            pos += ln
            k = int.from_bytes(mv[pos:pos + 4], "big", signed=True)
            pos += 4
            parts = [int.from_bytes(mv[pos + 4 * i:pos + 4 * i + 4], "big", signed=True) for i in range(max(k, 0))]
            pos += 4 * max(k, 0)
            if pos > len(mv):
                return []
            out.append((name, parts))
        return out
    except (ValueError, UnicodeDecodeError):
        return []
