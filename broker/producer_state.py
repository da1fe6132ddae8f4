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

The state is rebuilt on start from the batch headers in the log (producer id, epoch and
base sequence are in every v2 batch header), so it survives a restart without snapshots.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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
