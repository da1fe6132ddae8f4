"""Produce (key 0), advertised 0-11, record batches v2 (magic 2) only.

The range starts at 0 because librdkafka <= 2.3 (Debian's kcat) only compresses when
the broker's Produce range contains 0; such clients still send v3+ with v2 batches. A
v0-2 request carries magic 0/1 message sets, which are refused per partition with
UNSUPPORTED_FOR_MESSAGE_FORMAT. v3 adds transactional_id; v5 log_start_offset in the
response; v7 allows zstd; v8 record_errors and error_message; v9 flexible; v10/11 are
the same as v9 (KIP-951 adds only tagged fields).

The hot path treats batches as opaque: check the 61-byte header and CRC32C, then storage
copies the bytes into the segment and patches baseOffset and partitionLeaderEpoch in
place (both lie outside the CRC). No per-record Python work. acks=0 gets no response.
Exception: a CreateTime batch whose header maxTimestamp is -1 or below firstTimestamp
gets the true maximum computed from its records and a new CRC (Kafka's LogValidator does
this for every batch), because the timestamp index is built from that field. A topic that
sets message.timestamp.before.max.ms / after.max.ms (or the older difference.max.ms) has
every record checked against them (INVALID_TIMESTAMP with record_errors, as Kafka). A
topic whose compression.type names a codec (not ``producer``) gets every batch in another
codec re-encoded with it before it is stored, as Kafka does.
every record checked against them (INVALID_TIMESTAMP with record_errors, as Kafka).
On a compacted topic every record's key is checked: a keyless record is INVALID_RECORD
with a record error (Kafka's LogValidator), the whole batch refused.
"""
from __future__ import annotations

import logging

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import (COMPRESSION_CODEC_MASK, NO_TIMESTAMP, TIMESTAMP_TYPE_MASK, BatchHeader,
                              InvalidRecordBatch, batch_records_section, max_timestamp_needs_recompute,
                              record_spans, record_timestamps, recompress_batch,
                              set_create_time_max_timestamp, set_log_append_time,
                              validate_produce_records)
from storage import LogOffline, StorageError

from ..broker import Pending, now_ms
from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.PRODUCE
MIN_VERSION, MAX_VERSION = 0, 11

log = logging.getLogger("canopy.produce")


def _partition_response(index: int, error: int, base_offset: int = -1, log_append_time: int = -1,
                        log_start_offset: int = -1, message: str | None = None,
                        record_errors: list | None = None) -> dict:
    return {"index": index, "error_code": error, "base_offset": base_offset,
            "log_append_time_ms": log_append_time, "log_start_offset": log_start_offset,
            "record_errors": record_errors or [], "error_message": message}


#: Kafka's default for the timestamp bounds (Long.MAX_VALUE): no check.
UNBOUNDED = (1 << 63) - 1
_NO_BOUNDS = (UNBOUNDED, UNBOUNDED)


def timestamp_bounds(configs: dict) -> tuple[int, int]:
    """(message.timestamp.before.max.ms, message.timestamp.after.max.ms) of a topic's
    configs; ``_NO_BOUNDS`` itself when none is set.

    Kafka 3.6 split the deprecated message.timestamp.difference.max.ms into these two
    (KIP-937); a bound left at its default falls back to the old setting, as Kafka's
    LogConfig does. All three default to Long.MAX_VALUE (Kafka 3.x; 4.0 lowered
    after.max.ms to one hour, canopy keeps 3.x's default so no client is refused by
    surprise).
    """
    diff = configs.get("message.timestamp.difference.max.ms")
    before = configs.get("message.timestamp.before.max.ms")
    after = configs.get("message.timestamp.after.max.ms")
    if diff is None and before is None and after is None:
        return _NO_BOUNDS
    diff = UNBOUNDED if diff is None else int(diff)
    before = UNBOUNDED if before is None else int(before)
    after = UNBOUNDED if after is None else int(after)
    return (diff if before == UNBOUNDED else before, diff if after == UNBOUNDED else after)


def _validate_create_time(records, header, bounds: tuple[int, int]):
    """The per-record part of Kafka's LogValidator for a CreateTime topic, run only when
    a bound is configured or the header is visibly wrong. Returns (records, header),
    the batch rewritten if its maxTimestamp had to be fixed; raises InvalidRecordBatch
    (INVALID_TIMESTAMP with ``record_errors``, or CORRUPT_MESSAGE)."""
    stamps = record_timestamps(records)
    if bounds is not _NO_BOUNDS:
        errors = _check_timestamp_bounds(stamps, *bounds, now_ms())
        if errors:
            e = InvalidRecordBatch(errors[0]["batch_index_error_message"], ErrorCode.INVALID_TIMESTAMP)
            e.record_errors = errors
            raise e
    if max_timestamp_needs_recompute(header):
        # Kafka computes maxTimestamp from the records and rewrites the header (and CRC)
        # when it differs; the timestamp index, ListOffsets and time retention all read
        # the header. sarama sends -1 there.
        max_ts = max(stamps)
        records = bytearray(records)
        set_create_time_max_timestamp(records, 0, max_ts)
        header = header._replace(max_timestamp=max_ts)
    return records, header


def _check_timestamp_bounds(stamps: list[int], before: int, after: int, now: int) -> list:
    """Kafka's LogValidator.validateTimestamp for a CreateTime topic: every record with a
    timestamp must lie in [now - before, now + after]; one bad record fails the batch."""
    lo, hi = now - before, now + after
    return [{"batch_index": i, "batch_index_error_message":
             f"timestamp {ts} of the record at batch index {i} is out of range; "
             f"it should be within [{lo}, {hi}]"}
            for i, ts in enumerate(stamps) if ts != NO_TIMESTAMP and not lo <= ts <= hi]


def _keyless_records(records, partition) -> list:
    """Kafka's LogValidator refuses a record without a key on a compacted topic (the
    cleaner could never replace or delete it): one record error per keyless record."""
    try:
        h, body = batch_records_section(records)
        spans = record_spans(h, body)
    except InvalidRecordBatch as e:
        return [{"batch_index": 0, "batch_index_error_message": str(e)}]
    msg = (f"Compacted topic cannot accept message without key in topic partition "
           f"{partition.topic.name}-{partition.index}.")
    return [{"batch_index": i, "batch_index_error_message": msg}
            for i, r in enumerate(spans) if r[2] is None]   # r: RecordSpan fields (key at 2)


def produce_to_partition(broker, partition, records, version: int, acks: int = 1) -> dict:
    """Validate one partition's batch and append it. Returns the partition response."""
    index = partition.index
    if records is None or len(records) == 0:
        return _partition_response(index, ErrorCode.INVALID_RECORD, message="no record batch")
    try:
        header = validate_produce_records(records)
    except InvalidRecordBatch as e:
        log.info("rejected batch for %s-%d: %s", partition.topic.name, index, e)
        return _partition_response(index, e.error_code, message=str(e))
    if header.compression == 4 and version < 7:
        # zstd needs Produce v7+ (KIP-110): older clients cannot read it back.
        return _partition_response(index, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
    if header.is_control:
        return _partition_response(index, ErrorCode.INVALID_RECORD, message="clients may not write control batches")
    if header.is_transactional:
        return _partition_response(index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                   message="canopy does not support transactions")
    lg = partition.log
    if lg.offline:
        # Before the sequence check, as Kafka (an offline log directory answers for its
        # partitions before any validation): checked after, a refused batch's successor
        # would meet OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka answers that by bumping
        # its producer epoch and renumbering unacknowledged batches, duplicating any that
        # were appended (issue 10, disk-fsync-leader).
        return _partition_response(index, ErrorCode.KAFKA_STORAGE_ERROR, message=lg.offline)
    if lg.config.compact:
        errors = _keyless_records(records, partition)
        if errors:
            return _partition_response(index, ErrorCode.INVALID_RECORD,
                                       message=errors[0]["batch_index_error_message"],
                                       record_errors=errors)
    if acks == -1 and len(partition.replicas) > 1:
        # Kafka checks min.insync.replicas before appending: with too few in-sync
        # replicas an acks=all write could not be committed, so it is not written. The ISR
        # is the committed one (the metadata store's), never the leader's own guess.
        isr = partition.isr()
        if len(isr) < min_insync_replicas(broker, partition):
            return _partition_response(index, ErrorCode.NOT_ENOUGH_REPLICAS,
                                       message=f"ISR {isr} is smaller than min.insync.replicas")
    check = partition.producers.check(header.producer_id, header.producer_epoch,
                                      header.base_sequence, header.last_offset_delta)
    if check.duplicate is not None:
        # A retry of a batch already in the log: its original offsets, nothing appended.
        d = check.duplicate
        return _partition_response(index, 0, d.base_offset, -1, lg.log_start_offset)
    if check.error:
        return _partition_response(index, check.error, log_start_offset=lg.log_start_offset)
    codec = partition.topic.target_codec
    if codec is not None and codec != header.compression:
        # compression.type on the topic: Kafka's LogValidator re-encodes the batch with
        # the topic's codec (the default, producer, keeps the client's and costs nothing).
        try:
            records = recompress_batch(records, codec)
        except InvalidRecordBatch as e:
            return _partition_response(index, e.error_code, message=str(e))
        header = header._replace(attributes=(header.attributes & ~COMPRESSION_CODEC_MASK) | codec,
                                 batch_length=len(records) - 12)
    append_time = -1
    if partition.topic.timestamp_type == "LogAppendTime":
        append_time = now_ms()
        records = bytearray(records)
        set_log_append_time(records, 0, append_time)
    else:
        # Every batch of a CreateTime topic passes here, so the common case is a few
        # attribute reads: no configured bound and a header that can be right (the test
        # of protocol.records.max_timestamp_needs_recompute, inlined).
        configs = partition.topic.configs
        bounds = timestamp_bounds(configs) if configs else _NO_BOUNDS
        max_ts = header.max_timestamp
        if bounds is not _NO_BOUNDS or max_ts < header.base_timestamp or max_ts == NO_TIMESTAMP \
                or header.attributes & TIMESTAMP_TYPE_MASK:
            try:
                records, header = _validate_create_time(records, header, bounds)
            except InvalidRecordBatch as e:
                return _partition_response(index, e.error_code, message=str(e),
                                           record_errors=getattr(e, "record_errors", None))
    try:
        result = lg.append(records, leader_epoch=partition.leader_epoch)
    except InvalidRecordBatch as e:   # storage enforces max.message.bytes (MESSAGE_TOO_LARGE)
        return _partition_response(index, e.error_code, message=str(e))
    except (StorageError, OSError) as e:
        # Disk full or an I/O error: storage raised before committing anything, so
        # the log is intact and the client may retry (Kafka answers the same).
        log.warning("append to %s-%d failed: %s", partition.topic.name, index, e)
        return _partition_response(index, ErrorCode.KAFKA_STORAGE_ERROR, message=str(e))
    partition.producers.record(header.producer_id, header.producer_epoch, header.base_sequence,
                               header.last_offset_delta, result.base_offset, header.max_timestamp)
    partition.on_leader_append(result.base_offset)
    partition.bytes_in += len(records)
    partition.messages_in += header.records_count
    broker.flusher.mark_dirty(lg)
    return _partition_response(index, 0, result.base_offset, append_time, lg.log_start_offset)


def _is_idempotent(records) -> bool:
    """The batch carries a producer id (idempotent or transactional). A batch too short or
    malformed to say is not: forwarding leaves its validation to the leader."""
    try:
        return records is not None and BatchHeader.parse(records).producer_id >= 0
    except InvalidRecordBatch:
        return False


def min_insync_replicas(broker, partition) -> int:
    # The topic's override, else the broker's (possibly dynamic) min.insync.replicas.
    return int(broker.topics.config_value(partition.topic, "min.insync.replicas"))


def _partition_of(topic, index: int):
    return topic.partitions[index] if topic is not None and 0 <= index < len(topic.partitions) else None


async def handle(ctx, request: dict, version: int) -> dict | None:
    broker = ctx.broker
    acks = request["acks"]
    responses = []
    appended = False
    committed_waits = []   # (partition, next offset, response) for acks=all
    # Kafka: WRITE on the transactional id (when one is given) and on each topic, checked
    # before existence so a refused client learns nothing about which topics exist.
    txn_id = request.get("transactional_id")
    txn_denied = txn_id is not None and not ctx.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id)
    for topic_data in request["topic_data"]:
        name = topic_data["name"]
        topic = broker.topics.get(name)
        parts = []
        denied = txn_denied or not ctx.allowed(Operation.WRITE, ResourceType.TOPIC, name)
        for pd in topic_data["partition_data"]:
            index = pd["index"]
            if denied:
                parts.append(_partition_response(index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if txn_denied
                                                 else ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            elif acks not in (-1, 0, 1):
                parts.append(_partition_response(index, ErrorCode.INVALID_REQUIRED_ACKS))
            elif version < 3:
                parts.append(_partition_response(index, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT))
            # Looked up once, and only for a request that passed the checks above: a
            # topic's partitions are made at their first use (topics.Partitions), and a
            # refused write must not make one.
            elif (part := _partition_of(topic, index)) is None or not part.is_replica:
                parts.append(_partition_response(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            elif not part.is_leader or not broker.cluster.ready:
                # (A restarted ex-leader is not ready until its metadata is current: it
                # must not take writes on the strength of a stale tree.)
                if _is_idempotent(pd["records"]):
                    # Kafka's answer, never a forward: an idempotent producer keeps up to
                    # five requests in flight to the broker it believes leads, and judges
                    # each answer against the ones before it. Forwarded, a window could be
                    # half refused here and half appended at the leader; the leader then
                    # answers OUT_OF_ORDER_SEQUENCE_NUMBER, librdkafka bumps its producer
                    # epoch and renumbers every unacknowledged batch, including ones that
                    # were appended after all: duplicates (issue 10, partition-leader-etcd
                    # and disk-fsync-leader). NOT_LEADER_OR_FOLLOWER makes it refresh
                    # metadata and move its whole window to the leader.
                    parts.append(_partition_response(index, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                                     message="not the leader; idempotent batches are not forwarded"))
                else:
                    # Seed 000: commands go upstream. A follower forwards the write towards
                    # the leader and relays its answer, so a producer behind a load
                    # balancer that reaches any broker still succeeds.
                    parts.append(await broker.cluster.forward_produce(
                        part, pd["records"], acks, request["timeout_ms"], version))
            else:
                r = produce_to_partition(broker, part, pd["records"], version, acks)
                if r["error_code"] == 0:
                    appended = True
                    if acks == -1 and len(part.replicas) > 1:
                        committed_waits.append((part, part.log.log_end_offset, part.leader_epoch, r))
                parts.append(r)
        responses.append({"name": name, "partition_responses": parts})
    if acks == 0:
        return None
    response = {"responses": responses, "throttle_time_ms": 0}
    if not committed_waits and not (appended and broker.flusher.policy == "always"):
        return response
    # finish() must not refer to the request: its records are views of the connection's
    # receive buffer, which is reused for the next request only once no view is alive
    # (a fresh 1 MiB buffer per pipelined Produce cost the leader a quarter of its CPU).
    timeout_ms = request["timeout_ms"]

    async def finish() -> dict:
        nonlocal committed_waits
        if appended:
            try:
                await broker.flusher.wait_durable()
            except LogOffline as e:
                # The fsync covering this request failed: nothing it appended is durable. Kafka
                # fails such a request with KAFKA_STORAGE_ERROR (and takes the log directory
                # offline); an idempotent retry of a batch that did reach the disk is answered
                # with its original offsets later.
                for t in responses:
                    for r in t["partition_responses"]:
                        if r["error_code"] == 0:
                            r.update(error_code=ErrorCode.KAFKA_STORAGE_ERROR, base_offset=-1,
                                     error_message=f"not durable: {e}")
                committed_waits = []
        timeout_s = max(timeout_ms, 0) / 1000
        for p, offset, epoch, r in committed_waits:
            # acks=all: answer once the high watermark covers the batch, i.e. every in-sync
            # replica (leader counted) has it. Deeper tiers of the tree replicate asynchronously.
            committed = await p.wait_for_high_watermark(offset, timeout_s)
            if p.leader_epoch != epoch or not p.is_leader:
                # Leadership moved while we waited (this broker was paused or cut off, say):
                # the batch may have been truncated away here, so a success would acknowledge
                # a record that exists nowhere. Kafka answers NOT_LEADER_OR_FOLLOWER and the
                # (idempotent) producer retries at the new leader.
                r.update(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, base_offset=-1, log_append_time_ms=-1,
                         error_message=f"leader epoch moved from {epoch} to {p.leader_epoch} while waiting for the ISR")
            elif not committed:
                isr = p.isr()
                r["error_code"] = (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                                   if len(isr) < min_insync_replicas(broker, p) else ErrorCode.REQUEST_TIMED_OUT)
                r["error_message"] = f"not replicated to the ISR {isr} within {timeout_ms} ms"
        return response

    # The waits run while the connection reads the next Produce (broker/server.py): a
    # producer's pipelined requests are appended back to back instead of one per ISR
    # round trip, and their group commits and ISR waits overlap.
    return Pending(finish)

