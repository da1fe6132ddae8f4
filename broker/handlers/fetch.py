"""Fetch (key 1), versions 4-12.

v4 isolation_level and last_stable_offset (canopy has no transactions: LSO = high
watermark); v5 log_start_offset; v7 fetch sessions (KIP-227); v9 current_leader_epoch
(KIP-320); v10 zstd; v11 rack_id and preferred_read_replica (KIP-392); v12 flexible with
last_fetched_epoch, answered with diverging_epoch when a replica's log has diverged. v13+
name topics by id only, so they are not offered: the Java client then keeps using names.

Rules clients depend on:
* Whole batches, starting with the one that contains fetch_offset; the first batch is
  returned whole even when it is larger than the limits (else a consumer could never
  make progress past it); after that, per-partition and per-response limits hold.
* A full fetch lists exactly the requested partitions (the Java client drops a response
  that lists others or omits one).
* Sessions (KIP-227, broker/fetch_sessions.py): a Fetch with session_epoch 0 opens a
  session; later ones name only changed partitions and are answered with only the
  partitions that have something new. Session-less fetches (epoch -1, librdkafka's and
  kafka-python's) are answered as before.
* Long polling: wait up to max_wait_ms for min_bytes, woken the moment data is appended.
  Only the partitions that woke are read again (a consumer of 1 000 partitions, one of
  them busy, would otherwise re-read 999 idle ones per append); the budget rules above
  hold across reads: what is gathered already counts against max_bytes.
* Record bytes go from the segment file to the socket with sendfile (ExternalBytes).
"""
from __future__ import annotations

import trio

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.schema import ExternalBytes
from storage import LogOffline, OffsetOutOfRange

from ..broker import monotonic_ms
from ..security.acl import Operation, ResourceType

API_KEY = ApiKey.FETCH
MIN_VERSION, MAX_VERSION = 4, 12


def check_leader_epoch(partition, requested: int) -> ErrorCode:
    """KIP-320: a client that knows a newer epoch than ours talks to a stale leader; one
    that knows an older epoch must refresh its metadata."""
    if requested is None or requested < 0 or requested == partition.leader_epoch:
        return ErrorCode.NONE
    return ErrorCode.FENCED_LEADER_EPOCH if requested < partition.leader_epoch else ErrorCode.UNKNOWN_LEADER_EPOCH


class _PartitionRead:
    __slots__ = ("topic_name", "request", "partition", "error", "result", "preferred_read_replica",
                 "diverging_epoch", "denied")

    def __init__(self, topic_name, request, partition):
        self.topic_name = topic_name
        self.request = request
        self.partition = partition
        self.error = ErrorCode.NONE
        self.result = None
        self.preferred_read_replica = -1
        self.diverging_epoch = None
        self.denied = False


def diverging_epoch(p, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
    """KIP-320/KIP-595: a replica fetching at ``fetch_offset`` whose last batch carries
    ``last_fetched_epoch`` has diverged from this log when this log's end of that epoch
    (or of the largest epoch below it) lies before ``fetch_offset``, or this log has no
    such epoch: answer (epoch, end offset) so it truncates there before appending. Checked
    on every replica Fetch, at every tier of the tree, so a follower that answered an
    OffsetForLeaderEpoch before truncating its own tail cannot leave its children
    holding that tail."""
    if last_fetched_epoch is None or last_fetched_epoch < 0:
        return None
    epoch, end = p.end_offset_for_epoch(last_fetched_epoch)
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None


def preferred_read_replica(broker, p, rack_id: str | None) -> int:
    """KIP-392: a leader tells a consumer whose client.rack matches a follower's rack to
    fetch from that follower instead, so the tree's leaves carry the read load."""
    if not rack_id or len(p.replicas) < 2:
        return -1
    racks = broker.racks()
    if racks.get(p.leader) == rack_id:
        return -1
    for node in p.replicas[1:]:
        if racks.get(node) == rack_id and broker.is_alive(node):
            return node
    return -1


class _Wakeup:
    """One waiting Fetch: its event and the partitions that woke it since it last read."""
    __slots__ = ("event", "woken")

    def __init__(self):
        self.event = trio.Event()
        self.woken: list[_PartitionWaker] = []


class _PartitionWaker:
    """Parked in a partition's ``waiters`` in place of a bare trio.Event (notify_append
    calls ``set()`` on each and clears the set): notes that this partition woke."""
    __slots__ = ("wakeup", "partition", "reads")

    def __init__(self, wakeup: _Wakeup, partition):
        self.wakeup = wakeup
        self.partition = partition
        self.reads: list[tuple[int, _PartitionRead]] = []   # (position in the request, read)

    def set(self) -> None:
        self.wakeup.woken.append(self)
        self.wakeup.event.set()


def _read_all(broker, reads: list[_PartitionRead], max_bytes: int, replica_id: int, total: int = 0) -> int:
    """(Re)read these partitions, in request order; ``total`` is what the other partitions
    of the request hold already. Returns the new total of bytes gathered."""
    budget = max_bytes - total
    for r in reads:
        if r.result is not None:
            total -= r.result.size
            budget = max_bytes - total
            r.result.release()
            r.result = None
        p = r.partition
        if r.denied:
            r.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            continue
        if p is None:
            r.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            continue
        if not p.is_replica or p.fenced:
            # A fenced former leader (restarted, awaiting the controller's decision) is
            # neither leader nor follower: it must not feed followers or consumers a log
            # it may have lost.
            r.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            continue
        r.error = check_leader_epoch(p, r.request.get("current_leader_epoch", -1))
        if r.error:
            continue
        if r.preferred_read_replica >= 0:
            continue
        if p.log.offline:
            r.error = ErrorCode.KAFKA_STORAGE_ERROR   # an fsync failed: Kafka's offline log
            continue
        fetch_offset = r.request["fetch_offset"]
        # Replicas read up to the log end; consumers never past the high watermark.
        hw = p.log.log_end_offset if replica_id >= 0 else p.high_watermark
        # Only offsets outside [log start, log end] are out of range (Kafka's rule). An
        # offset between the HW and the log end is valid but not yet readable: the answer
        # is an empty partition, so a consumer that saw records up to a failed leader's HW,
        # or reads from a follower whose HW lags (KIP-392), just waits instead of
        # resetting to earliest (replay) or latest (silent skip).
        if fetch_offset > p.log.log_end_offset or fetch_offset < p.log_start_offset:
            r.error = ErrorCode.OFFSET_OUT_OF_RANGE
            continue
        if replica_id >= 0:
            r.diverging_epoch = diverging_epoch(p, fetch_offset, r.request.get("last_fetched_epoch", -1))
            if r.diverging_epoch is not None:
                continue
        if fetch_offset >= hw:
            continue
        # After the first non-empty partition, the response budget applies; the first
        # batch overall is always whole (storage returns it even when over the limit).
        limit = min(r.request["partition_max_bytes"], budget) if total else r.request["partition_max_bytes"]
        if total and limit <= 0:
            continue
        try:
            r.result = p.log.read(fetch_offset, max(limit, 1), upper_offset=hw, min_one_batch=not total)
        except OffsetOutOfRange:
            r.error = ErrorCode.OFFSET_OUT_OF_RANGE
            continue
        except LogOffline:
            r.error = ErrorCode.KAFKA_STORAGE_ERROR   # an fsync failed: Kafka's offline log
            continue
        total += r.result.size
        budget = max_bytes - total
    return total


def _hw_news(reads, replica_id: int) -> bool:
    return any(r.partition is not None and r.partition.high_watermark > r.partition.hw_sent.get(replica_id, -1)
               for r in reads)


async def handle(ctx, request: dict, version: int) -> dict:
    broker = ctx.broker
    registry = broker.topics
    reads: list[_PartitionRead] = []
    replica_id = request.get("replica_id", -1)
    fetch = broker.fetch_sessions.context(request, monotonic_ms())
    if fetch.error:
        return {"throttle_time_ms": 0, "error_code": fetch.error, "session_id": 0, "responses": []}
    # Kafka: a replica's fetch needs CLUSTER_ACTION on the cluster, a consumer's READ on
    # each topic; refused partitions answer TOPIC_AUTHORIZATION_FAILED (and are not read).
    replica_allowed = replica_id < 0 or ctx.allowed(Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    topics: dict[str, tuple] = {}
    for name, pr in fetch.partitions:
        looked_up = topics.get(name)
        if looked_up is None:
            denied = not replica_allowed or (replica_id < 0 and not ctx.allowed(Operation.READ,
                                                                                ResourceType.TOPIC, name))
            looked_up = topics[name] = (registry.get(name), denied)
        topic, denied = looked_up
        idx = pr["partition"]
        p = topic.partitions[idx] if topic is not None and 0 <= idx < len(topic.partitions) and not denied \
            else None
        reads.append(r := _PartitionRead(name, pr, p))
        r.denied = denied

    max_bytes = request.get("max_bytes", 0x7FFFFFFF)
    min_bytes = request["min_bytes"]
    if replica_id >= 0:
        now = monotonic_ms()   # lag time must not jump with the wall clock
        for r in reads:
            if r.partition is not None:
                r.partition.record_replica_fetch(replica_id, r.request["fetch_offset"], now)
    elif rack := request.get("rack_id"):
        for r in reads:
            if r.partition is not None and r.partition.is_leader:
                r.preferred_read_replica = preferred_read_replica(broker, r.partition, rack)
    deadline = trio.current_time() + max(request["max_wait_ms"], 0) / 1000
    total = _read_all(broker, reads, max_bytes, replica_id)
    # A Fetch naming no partitions (the Java consumer sends one on close) is answered at once;
    # a replica is also answered as soon as the high watermark moved past what it was last
    # told, so the HW travels down the tree without waiting for new data.
    wakeup = wakers = None
    try:
        while (reads and total < min_bytes
               and not any(r.error or r.preferred_read_replica >= 0 or r.diverging_epoch for r in reads)
               and not (replica_id >= 0 and _hw_news(reads, replica_id))):
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            if wakers is None:
                wakeup, wakers = _Wakeup(), {}
                for i, r in enumerate(reads):
                    if r.partition is not None:
                        w = wakers.get(id(r.partition))
                        if w is None:
                            w = wakers[id(r.partition)] = _PartitionWaker(wakeup, r.partition)
                        w.reads.append((i, r))
                parked = wakers.values()
            # A partition's wakers leave its waiters when it wakes them: only those that
            # woke go back; the others are still parked from earlier rounds.
            for w in parked:
                w.partition.waiters.add(w)
            with trio.move_on_after(remaining):
                await wakeup.event.wait()
            if not wakeup.event.is_set():
                break
            parked = list(dict.fromkeys(wakeup.woken))
            wakeup.event, wakeup.woken = trio.Event(), []
            again = sorted((ir for w in parked for ir in w.reads), key=lambda ir: ir[0])
            total = _read_all(broker, [r for _, r in again], max_bytes, replica_id, total)
    finally:
        if wakers:
            for w in wakers.values():
                w.partition.waiters.discard(w)

    session = fetch.session
    if fetch.new_session:
        session = broker.fetch_sessions.create(fetch.partitions, replica_id >= 0, monotonic_ms())
    responses: dict[str, list] = {}
    order: list[str] = []
    busy = []
    for r in reads:
        p = r.partition
        hw = p.high_watermark if p is not None else -1
        log_start = p.log_start_offset if p is not None else -1
        if p is not None and replica_id >= 0:
            p.hw_sent[replica_id] = hw
        has_records = r.result is not None and r.result.size > 0
        if session is not None:
            key = (r.topic_name, r.request["partition"])
            # (None: another Fetch of this session forgot the partition while this one waited.)
            cached = session.partitions.get(key)
            news = cached is None or cached.must_respond(
                hw, log_start, r.error, has_records,
                r.diverging_epoch is not None or r.preferred_read_replica >= 0)
            if has_records:
                busy.append(key)
            if fetch.incremental and not news and key not in fetch.named:
                if r.result is not None:
                    r.result.release()
                continue
        if r.topic_name not in responses:
            responses[r.topic_name] = []
            order.append(r.topic_name)
        if has_records:
            records = ExternalBytes(r.result.size, r.result)
            if replica_id >= 0:
                p.replication_bytes_out += r.result.size
            else:
                p.bytes_out += r.result.size
        else:
            records = b""
            if r.result is not None:
                r.result.release()
        extra = {}
        if r.diverging_epoch is not None:
            extra["diverging_epoch"] = {"epoch": r.diverging_epoch[0], "end_offset": r.diverging_epoch[1]}
        responses[r.topic_name].append({
            **extra,
            "partition_index": r.request["partition"],
            "error_code": r.error,
            "high_watermark": hw,
            "last_stable_offset": hw,
            "log_start_offset": log_start,
            "aborted_transactions": [],
            "preferred_read_replica": r.preferred_read_replica,
            "records": records,
        })
    if session is not None:
        session.move_to_end(busy)
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": session.id if session is not None else 0,
            "responses": [{"topic": name, "partitions": responses[name]} for name in order]}
