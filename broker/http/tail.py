"""The HTTP tail: GET /topics/T/partitions/P/records streams a partition's records as
newline-delimited JSON, from an offset or a point in time, optionally following the log.

* ``from=OFFSET`` (or ``earliest``/``latest``), or ``from_time=ISO8601/RFC3339``: the
  start offset is what ListOffsets answers for that timestamp (the first record whose
  timestamp is >= it, exact to the record), which is where a Kafka consumer that called
  offsets_for_times and seeked there starts. No record that late: start at the high
  watermark (nothing now; with ``follow`` every later record).
* Records are served up to the high watermark only, as to any consumer; compressed
  batches are decompressed, and records of a batch before the start offset skipped.
* ``follow=1``: at the high watermark, wait for it to move (the same per-partition
  wakeup long-polling Fetch uses) instead of ending. ``max_records`` / ``max_bytes``
  (bytes of NDJSON written) end the response early.
* A reader that stops reading holds one chunk in the broker: the response body is
  written with back-pressure, and the listening socket's TCP_USER_TIMEOUT makes the
  kernel drop a connection whose peer has accepted nothing for the send timeout
  (app.py).

Each line: {"offset", "timestamp", "key", "value", "headers": [{"key", "value"}]}; a key
or value that is not UTF-8 comes as "key_base64"/"value_base64" instead (null stays
null).
"""
from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from urllib.parse import parse_qs

import trio

from protocol.errors import ErrorCode
from protocol.records import BatchHeader, InvalidRecordBatch, iter_records, split_batches
from storage import LogOffline, OffsetOutOfRange, StorageError

from ..handlers.list_offsets import lookup

READ_CHUNK = 256 * 1024


class BadRequest(Exception):
    def __init__(self, status: int, error: str, message: str, **extra):
        super().__init__(message)
        self.status, self.error, self.extra = status, error, extra

    def body(self) -> dict:
        return {"error": self.error, "message": str(self), **self.extra}


def _int_param(q: dict, name: str, minimum: int) -> int | None:
    raw = q.get(name)
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        raise BadRequest(400, "INVALID_REQUEST", f"{name} must be an integer, got {raw!r}") from None
    if v < minimum:
        raise BadRequest(400, "INVALID_REQUEST", f"{name} must be >= {minimum}, got {v}")
    return v


def parse_time(raw: str) -> int:
    """ISO 8601 / RFC 3339 ("2026-01-02T03:04:05.678Z", "+01:00" offsets) to epoch ms. A
    time without a zone is UTC."""
    try:
        t = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise BadRequest(400, "INVALID_TIMESTAMP",
                         f"from_time must be an ISO 8601 / RFC 3339 time such as 2026-01-02T03:04:05Z, got {raw!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    # Integer arithmetic: exact to the millisecond (timestamp() is a float).
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if ms < 0:
        raise BadRequest(400, "INVALID_TIMESTAMP", f"from_time {raw!r} is before 1970")
    return ms


class TailRequest:
    def __init__(self, broker, topic: str, partition_raw: str, query: bytes):
        q = {k: v[-1] for k, v in parse_qs(query.decode("latin-1"), keep_blank_values=True).items()}
        known = {"from", "from_time", "follow", "max_records", "max_bytes"}
        unknown = sorted(set(q) - known)
        if unknown:
            raise BadRequest(400, "INVALID_REQUEST", f"unknown parameter(s) {', '.join(unknown)}; "
                                                     f"known: {', '.join(sorted(known))}")
        try:
            index = int(partition_raw)
        except ValueError:
            raise BadRequest(400, "INVALID_REQUEST", f"partition must be an integer, got {partition_raw!r}") from None
        t = broker.topics.get(topic)
        if t is None:
            raise BadRequest(404, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name, f"unknown topic {topic!r}")
        if not 0 <= index < len(t.partitions):
            raise BadRequest(404, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name,
                             f"topic {topic!r} has partitions 0..{len(t.partitions) - 1}, not {index}")
        p = t.partitions[index]
        if not p.is_replica or p.fenced:
            raise BadRequest(421, ErrorCode.NOT_LEADER_OR_FOLLOWER.name,
                             f"this broker holds no replica of {topic}-{index}", leader=p.leader)
        self.partition = p
        self.follow = q.get("follow", "0").lower() in ("1", "true", "yes")
        if q.get("follow", "0").lower() not in ("1", "true", "yes", "0", "false", "no", ""):
            raise BadRequest(400, "INVALID_REQUEST", f"follow must be 0 or 1, got {q['follow']!r}")
        self.max_records = _int_param(q, "max_records", 1)
        self.max_bytes = _int_param(q, "max_bytes", 1)
        if "from" in q and "from_time" in q:
            raise BadRequest(400, "INVALID_REQUEST", "give from or from_time, not both")
        lg = p.log
        if "from_time" in q:
            ts = parse_time(q["from_time"])
            err, offset, _ = lookup(p, ts)
            if err:
                raise BadRequest(400, ErrorCode(err).name, f"no offset for {q['from_time']!r}")
            self.start = offset if offset >= 0 else p.high_watermark
        else:
            raw = q.get("from", "earliest")
            if raw == "earliest":
                self.start = lg.log_start_offset
            elif raw == "latest":
                self.start = p.high_watermark
            else:
                v = _int_param(q, "from", -(1 << 63))
                if v < 0:
                    raise BadRequest(400, "INVALID_REQUEST", f"from must be an offset >= 0, earliest or latest, got {raw!r}")
                if v < lg.log_start_offset or v > lg.log_end_offset:
                    raise BadRequest(416, ErrorCode.OFFSET_OUT_OF_RANGE.name,
                                     f"offset {v} is outside the log [{lg.log_start_offset}, {lg.log_end_offset}]",
                                     log_start_offset=lg.log_start_offset, log_end_offset=lg.log_end_offset)
                self.start = v


def _field(out: dict, name: str, value: bytes | None) -> None:
    if value is None:
        out[name] = None
        return
    try:
        out[name] = value.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_base64"] = base64.b64encode(value).decode("ascii")


def record_json(rec) -> dict:
    out = {"offset": rec.offset, "timestamp": rec.timestamp}
    _field(out, "key", rec.key)
    _field(out, "value", rec.value)
    headers = []
    for k, v in rec.headers:
        h = {"key": k}
        _field(h, "value", v)
        headers.append(h)
    out["headers"] = headers
    return out


async def stream(req: TailRequest, send_chunk, disconnected: trio.Event) -> None:
    """Write NDJSON chunks with ``send_chunk(bytes)`` until the end (see module doc)."""
    p = req.partition
    offset = req.start
    sent_records = sent_bytes = 0
    while True:
        if disconnected.is_set():
            return
        hw = p.high_watermark
        if offset < p.log.log_start_offset:
            offset = p.log.log_start_offset   # retention passed us while following
        if offset >= hw:
            if not req.follow:
                return
            wake = trio.Event()
            p.waiters.add(wake)
            try:
                with trio.move_on_after(5):
                    await wake.wait()
            finally:
                p.waiters.discard(wake)
            continue
        try:
            result = p.log.read(offset, READ_CHUNK, upper_offset=hw)
        except (OffsetOutOfRange, LogOffline, StorageError):
            return
        try:
            data = await trio.to_thread.run_sync(result.read_bytes) if result.size else b""
        finally:
            result.release()
        if not data:
            if not req.follow:
                return
            await trio.sleep(0.05)
            continue
        try:
            batches = split_batches(data, strict=False, check_crc=False)
        except InvalidRecordBatch:
            return
        lines = []
        done = False
        for pos, size in batches:
            for rec in iter_records(data, pos):
                if rec.offset < offset:
                    continue
                if rec.offset >= hw:
                    break
                line = (json.dumps(record_json(rec), ensure_ascii=False) + "\n").encode("utf-8")
                if req.max_bytes is not None and sent_bytes + len(line) > req.max_bytes and (sent_records or lines):
                    done = True
                    break
                lines.append(line)
                sent_bytes += len(line)
                sent_records += 1
                offset = rec.offset + 1
                if req.max_records is not None and sent_records >= req.max_records:
                    done = True
                    break
            if done:
                break
        if lines:
            await send_chunk(b"".join(lines))
        if done:
            return
        # Past the last batch read even when none of its records was sent (all below the
        # start offset, or a batch with no records left after compaction-like gaps).
        offset = max(offset, BatchHeader.parse(data, batches[-1][0]).next_offset)
