"""Produce/Fetch semantics checked at the byte level against a real broker process:
idempotent producers (duplicates, gaps, fencing, restart), Fetch limits and long
polling, LogAppendTime, DeleteRecords and the flush policies."""
from __future__ import annotations

import threading
import time

import pytest

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import BatchHeader, iter_records

from tests.faults.history import iter_all_records

from .rawclient import RawClient, create_topic, end_offset, init_producer_id, make_batch, produce


@pytest.fixture
def client(broker):
    c = RawClient(broker.bootstrap)
    yield c
    c.close()


def _fetch(client, topic, offset, partition_max=1 << 20, max_bytes=1 << 30, max_wait=0, min_bytes=0, version=12):
    r = client.request(ApiKey.FETCH, version, {
        "replica_id": -1, "max_wait_ms": max_wait, "min_bytes": min_bytes, "max_bytes": max_bytes,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": offset, "partition_max_bytes": partition_max,
             "current_leader_epoch": -1, "log_start_offset": -1}]}]})
    return r["responses"][0]["partitions"][0]


def _batches(records: bytes) -> list[BatchHeader]:
    out, pos = [], 0
    while pos < len(records):
        h = BatchHeader.parse(records, pos)
        out.append(h)
        pos += h.total_size
    return out


def test_idempotent_retry_of_last_five_is_answered_with_original_offsets(broker, client):
    create_topic(client, "idem")
    pid, epoch = init_producer_id(client)
    batches = [make_batch([b"m%d" % i, b"n%d" % i], producer_id=pid, producer_epoch=epoch, base_sequence=2 * i)
               for i in range(7)]
    offsets = [produce(client, "idem", b, acks=-1)["base_offset"] for b in batches]
    assert offsets == [0, 2, 4, 6, 8, 10, 12]
    for i in range(2, 7):  # the last five: duplicates, same offsets, nothing appended
        r = produce(client, "idem", batches[i], acks=-1)
        assert (r["error_code"], r["base_offset"]) == (0, offsets[i])
    assert end_offset(client, "idem") == 14
    # An older batch than the cached five is out of order, not silently re-appended.
    assert produce(client, "idem", batches[0], acks=-1)["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert end_offset(client, "idem") == 14


def test_sequence_gap_is_out_of_order(broker, client):
    create_topic(client, "gap")
    pid, epoch = init_producer_id(client)
    assert produce(client, "gap", make_batch([b"a"], producer_id=pid, producer_epoch=epoch, base_sequence=0))["error_code"] == 0
    r = produce(client, "gap", make_batch([b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=2))
    assert r["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(client, "gap", make_batch([b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=1))["error_code"] == 0
    assert end_offset(client, "gap") == 2


def test_older_epoch_is_fenced(broker, client):
    create_topic(client, "fence")
    pid, _ = init_producer_id(client)
    assert produce(client, "fence", make_batch([b"a"], producer_id=pid, producer_epoch=3, base_sequence=0))["error_code"] == 0
    r = produce(client, "fence", make_batch([b"b"], producer_id=pid, producer_epoch=2, base_sequence=1))
    assert r["error_code"] == ErrorCode.INVALID_PRODUCER_EPOCH


def test_producer_state_survives_restart(broker_factory, tmp_path):
    b = broker_factory("restart")
    c = RawClient(b.bootstrap)
    create_topic(c, "state")
    pid, epoch = init_producer_id(c)
    sent = [make_batch([b"x%d" % i], producer_id=pid, producer_epoch=epoch, base_sequence=i) for i in range(3)]
    for s in sent:
        produce(c, "state", s, acks=-1)
    c.close()
    b.kill9()
    b2 = broker_factory("restart")
    c = RawClient(b2.bootstrap)
    r = produce(c, "state", sent[2], acks=-1)  # a retry arriving after the restart
    assert (r["error_code"], r["base_offset"]) == (0, 2)
    r = produce(c, "state", make_batch([b"y"], producer_id=pid, producer_epoch=epoch, base_sequence=5))
    assert r["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # New producer ids never repeat one handed out before the restart.
    assert init_producer_id(c)[0] > pid
    assert end_offset(c, "state") == 3
    c.close()


def test_transactional_requests_get_a_clear_error(broker, client):
    r = client.request(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "tx-1", "transaction_timeout_ms": 60000,
                                                    "producer_id": -1, "producer_epoch": -1})
    assert r["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    r = client.request(ApiKey.FIND_COORDINATOR, 3, {"key": "tx-1", "key_type": 1})
    assert r["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_fetch_returns_whole_batches_from_the_one_holding_the_offset(broker, client):
    create_topic(client, "whole")
    for i in range(5):
        produce(client, "whole", make_batch([b"%d-%d" % (i, j) for j in range(10)]))
    p = _fetch(client, "whole", 23)
    heads = _batches(p["records"])
    assert heads[0].base_offset == 20 and heads[-1].last_offset == 49
    assert p["high_watermark"] == 50 and p["log_start_offset"] == 0


def test_fetch_first_batch_whole_even_over_limits(broker, client):
    create_topic(client, "limits")
    big = make_batch([b"x" * 5000])
    small = make_batch([b"y" * 100])
    produce(client, "limits", big)
    produce(client, "limits", small)
    p = _fetch(client, "limits", 0, partition_max=100, max_bytes=100)
    heads = _batches(p["records"])
    assert len(heads) == 1 and heads[0].total_size == len(big)   # whole, despite the 100-byte limits
    p = _fetch(client, "limits", 0, partition_max=len(big) + len(small))
    assert len(_batches(p["records"])) == 2


def test_fetch_response_limit_across_partitions(broker, client):
    r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{"name": "multi", "num_partitions": 2,
                                                             "replication_factor": 1}], "timeout_ms": 5000})
    assert r["topics"][0]["error_code"] == 0
    for part in (0, 1):
        client.request(ApiKey.PRODUCE, 9, {"acks": 1, "timeout_ms": 5000, "topic_data": [{"name": "multi", "partition_data": [
            {"index": part, "records": bytes(make_batch([b"z" * 3000]))}]}]})
    r = client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 3500, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "multi", "partitions": [
            {"partition": i, "fetch_offset": 0, "partition_max_bytes": 1 << 20} for i in (1, 0)]}]})
    parts = r["responses"][0]["partitions"]
    # Exactly the requested partitions, in the requested order; the second is over budget.
    assert [p["partition_index"] for p in parts] == [1, 0]
    assert len(parts[0]["records"]) > 3000 and len(parts[1]["records"]) == 0


@pytest.mark.parametrize("big_partition", [None, 2])
def test_fetch_of_several_partitions_holds_each_ones_batches(broker, client, big_partition):
    """Record bytes are spliced into the response between the other fields of each
    partition: copied into one write when they total at most 64 KiB (server.py,
    SMALL_RESPONSE_COPY), sent from the segment files with sendfile when one partition
    holds more. Each partition of a two-topic Fetch gets exactly its own records, in
    request order, and the frame decodes to its last byte (RawClient's exact decode)."""
    for topic in ("splice-a", "splice-b"):
        r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{"name": topic, "num_partitions": 3,
                                                                 "replication_factor": 1}], "timeout_ms": 5000})
        assert r["topics"][0]["error_code"] == 0, r
    want = {}
    for topic in ("splice-a", "splice-b"):
        for part in range(3):
            size = 30_000 if topic == "splice-b" and part == big_partition else 200
            vals = [b"%s/%d/%d/" % (topic.encode(), part, i) + bytes([65 + i]) * size for i in range(3)]
            _produce_to(client, topic, part, make_batch(vals[:2]))
            _produce_to(client, topic, part, make_batch(vals[2:]))
            want[(topic, part)] = vals
    r = client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 30, "session_id": 0,
        "session_epoch": -1, "topics": [{"topic": t, "partitions": [
            {"partition": i, "fetch_offset": 0, "partition_max_bytes": 1 << 20} for i in (2, 0, 1)]}
            for t in ("splice-b", "splice-a")]})
    got = {(t["topic"], p["partition_index"]): [r.value for r in iter_all_records(bytes(p["records"]))]
           for t in r["responses"] for p in t["partitions"]}
    assert [(t["topic"], p["partition_index"]) for t in r["responses"] for p in t["partitions"]] == \
        [(t, i) for t in ("splice-b", "splice-a") for i in (2, 0, 1)]
    assert got == want


def test_long_poll_wakes_on_append(broker, client):
    create_topic(client, "poll")
    producer = RawClient(broker.bootstrap)
    timer = threading.Timer(0.5, lambda: produce(producer, "poll", make_batch([b"wake"])))
    started = time.monotonic()
    timer.start()
    p = _fetch(client, "poll", 0, max_wait=20000, min_bytes=1)
    waited = time.monotonic() - started
    timer.join()
    producer.close()
    assert [r.value for r in iter_records(bytes(p["records"]))] == [b"wake"]
    assert waited < 15  # woken by the append, not by the 20 s max_wait


def _produce_to(client, topic, partition, batch):
    r = client.request(ApiKey.PRODUCE, 9, {"acks": 1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": bytes(batch)}]}]})
    part = r["responses"][0]["partition_responses"][0]
    assert part["error_code"] == 0, part
    return part["base_offset"]


def _many_partitions_waiting(broker, client, topic, n):
    """A topic of n partitions, partition i holding i % 4 records; returns {partition: HW}."""
    r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{"name": topic, "num_partitions": n,
                                                             "replication_factor": 1}], "timeout_ms": 5000})
    assert r["topics"][0]["error_code"] == 0, r
    hws = {}
    for i in range(n):
        if i % 4:
            _produce_to(client, topic, i, make_batch([b"old-%d-%d" % (i, k) for k in range(i % 4)]))
        hws[i] = i % 4
    return hws


def _fetch_at_ends(client, topic, hws, max_wait, min_bytes, max_bytes=1 << 30):
    return client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": max_wait, "min_bytes": min_bytes, "max_bytes": max_bytes,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [
            {"partition": i, "fetch_offset": hw, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
             "log_start_offset": -1} for i, hw in hws.items()]}]}, timeout=60)["responses"][0]["partitions"]


def _fetch_at_ends_while_producing(broker, client, topic, hws, appends, **fetch):
    """_fetch_at_ends, while another connection appends each (partition, batch) of
    ``appends`` 0.5 s apart: each append wakes the parked Fetch once."""
    producer = RawClient(broker.bootstrap)

    def produce_later():
        for partition, batch in appends:
            time.sleep(0.5)
            _produce_to(producer, topic, partition, batch)
    thread = threading.Thread(target=produce_later)
    thread.start()
    try:
        return _fetch_at_ends(client, topic, hws, **fetch)
    finally:
        thread.join()
        producer.close()


def test_long_poll_over_many_partitions_returns_what_woke_it(broker, client):
    """A consumer long-polls 300 partitions, each at its log end; appends to two of them,
    one after the other, wake it twice (min_bytes needs both). The answer lists every
    partition in request order, with exactly the two new batches and each partition's HW."""
    hws = _many_partitions_waiting(broker, client, "wide", 300)
    first, second = make_batch([b"first-a", b"first-b"]), make_batch([b"second"])
    parts = _fetch_at_ends_while_producing(broker, client, "wide", hws, [(137, first), (42, second)],
                                           max_wait=30000, min_bytes=len(first) + len(second))
    assert [p["partition_index"] for p in parts] == list(range(300))
    got = {p["partition_index"]: [(r.offset, r.value) for r in iter_records(bytes(p["records"]))]
           for p in parts if len(p["records"])}
    assert got == {137: [(1, b"first-a"), (2, b"first-b")], 42: [(2, b"second")]}
    expected_hw = {**hws, 137: 3, 42: 3}
    assert {p["partition_index"]: p["high_watermark"] for p in parts} == expected_hw
    assert all(p["error_code"] == 0 and p["log_start_offset"] == 0 for p in parts)


def test_long_poll_over_many_partitions_keeps_the_response_limit(broker, client):
    """What the first wake gathered counts against max_bytes when a later wake reads: the
    second partition's batch does not fit and is left for the next Fetch."""
    hws = _many_partitions_waiting(broker, client, "wide2", 100)
    first, second = make_batch([b"a" * 2000]), make_batch([b"b" * 2000])
    parts = _fetch_at_ends_while_producing(broker, client, "wide2", hws, [(70, first), (10, second)],
                                           max_wait=3000, min_bytes=len(first) + len(second),
                                           max_bytes=len(first) + 500)
    with_data = {p["partition_index"]: bytes(p["records"]) for p in parts if len(p["records"])}
    assert list(with_data) == [70] and [r.value for r in iter_records(with_data[70])] == [b"a" * 2000]
    assert {p["partition_index"]: p["high_watermark"] for p in parts} == {**hws, 70: hws[70] + 1,
                                                                          10: hws[10] + 1}


def test_long_poll_times_out_empty(broker, client):
    create_topic(client, "idle")
    p = _fetch(client, "idle", 0, max_wait=300, min_bytes=1)
    assert p["error_code"] == 0 and len(p["records"]) == 0


def test_log_append_time_topic_rewrites_timestamps(broker, client):
    create_topic(client, "lat", {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    r = produce(client, "lat", make_batch([b"a", b"b"], timestamp=1000))
    assert r["error_code"] == 0 and r["log_append_time_ms"] >= before
    p = _fetch(client, "lat", 0)
    head = _batches(p["records"])[0]
    assert head.timestamp_type == 1 and head.max_timestamp == r["log_append_time_ms"]
    assert all(rec.timestamp == r["log_append_time_ms"] for rec in iter_records(bytes(p["records"])))


def test_delete_records_advances_log_start_offset(broker, client):
    create_topic(client, "dr")
    for i in range(4):
        produce(client, "dr", make_batch([b"%d" % i]))
    r = client.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": "dr", "partitions": [
        {"partition_index": 0, "offset": 2}]}], "timeout_ms": 5000})
    assert r["topics"][0]["partitions"][0] == {"partition_index": 0, "low_watermark": 2, "error_code": 0}
    assert _fetch(client, "dr", 1)["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE
    p = _fetch(client, "dr", 2)
    assert p["log_start_offset"] == 2
    assert [rec.offset for rec in iter_records(bytes(p["records"]))][0] <= 2
    lo = client.request(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
        {"name": "dr", "partitions": [{"partition_index": 0, "timestamp": -2}]}]})
    assert lo["topics"][0]["partitions"][0]["offset"] == 2


@pytest.mark.parametrize("policy", ["always", "interval"])
def test_flush_policies_acknowledge_and_keep_data(broker_factory, policy):
    b = broker_factory(f"flush-{policy}", extra_args=["--flush", policy, "--flush-interval-ms", "50"])
    clients = [RawClient(b.bootstrap) for _ in range(4)]
    create_topic(clients[0], "durable")
    # Several connections producing at once: with `always` they share group commits.
    errors = []

    def work(c, n):
        for i in range(n):
            r = produce(c, "durable", make_batch([b"v%d" % i]), acks=-1)
            if r["error_code"]:
                errors.append(r)

    threads = [threading.Thread(target=work, args=(c, 25)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert end_offset(clients[0], "durable") == 100
    for c in clients:
        c.close()
    b.kill9()
    b2 = broker_factory(f"flush-{policy}", extra_args=["--flush", policy])
    c = RawClient(b2.bootstrap)
    assert end_offset(c, "durable") == 100
    c.close()


def _session_fetch(client, topic, session_id, epoch, parts=None, forgotten=(), max_wait=0, min_bytes=0):
    """A Fetch v12 in a KIP-227 session; ``parts`` maps partition -> fetch offset."""
    return client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": max_wait, "min_bytes": min_bytes, "max_bytes": 1 << 30,
        "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": topic, "partitions": [
            {"partition": i, "fetch_offset": o, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
             "log_start_offset": -1} for i, o in parts.items()]}] if parts else [],
        "forgotten_topics_data": [{"topic": topic, "partitions": list(forgotten)}] if forgotten else [],
        "rack_id": ""}, timeout=60)


def _listed(resp) -> dict[int, dict]:
    assert resp["error_code"] == 0, resp
    return {p["partition_index"]: p for t in resp["responses"] for p in t["partitions"]}


def test_fetch_session_answers_only_what_changed(broker, client):
    """KIP-227 as the Java client uses it: a full Fetch with epoch 0 opens a session; each
    later Fetch names only partitions whose offset changed and is answered with only the
    partitions that have records, a new high watermark or a new log start offset."""
    hws = _many_partitions_waiting(broker, client, "sess", 50)
    opened = _session_fetch(client, "sess", 0, 0, hws)
    assert sorted(_listed(opened)) == list(range(50))
    sid = opened["session_id"]
    assert sid > 0
    assert _listed(_session_fetch(client, "sess", sid, 1)) == {}
    _produce_to(client, "sess", 7, make_batch([b"news"]))
    listed = _listed(_session_fetch(client, "sess", sid, 2))
    assert list(listed) == [7] and listed[7]["high_watermark"] == hws[7] + 1
    assert [(r.offset, r.value) for r in iter_records(bytes(listed[7]["records"]))] == [(hws[7], b"news")]
    # The consumer moves on: the partition it names is answered (empty); nothing else is new.
    listed = _listed(_session_fetch(client, "sess", sid, 3, {7: hws[7] + 1}))
    assert list(listed) == [7] and len(listed[7]["records"]) == 0
    assert _listed(_session_fetch(client, "sess", sid, 4)) == {}
    r = client.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": "sess", "partitions": [
        {"partition_index": 3, "offset": 1}]}], "timeout_ms": 5000})
    assert r["topics"][0]["partitions"][0]["error_code"] == 0
    listed = _listed(_session_fetch(client, "sess", sid, 5))
    assert list(listed) == [3] and listed[3]["log_start_offset"] == 1 and len(listed[3]["records"]) == 0
    # A forgotten partition is no longer read.
    assert _listed(_session_fetch(client, "sess", sid, 6, forgotten=[9])) == {}
    _produce_to(client, "sess", 9, make_batch([b"unseen"]))
    assert _listed(_session_fetch(client, "sess", sid, 7)) == {}
    # Kafka's errors: a stale epoch, and a session closed by epoch -1.
    stale = _session_fetch(client, "sess", sid, 7)
    assert (stale["error_code"], stale["session_id"], stale["responses"]) == \
        (ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [])
    closed = _session_fetch(client, "sess", sid, -1, {0: 0})
    assert closed["session_id"] == 0 and list(_listed(closed)) == [0]
    assert _session_fetch(client, "sess", sid, 8)["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_fetch_session_long_poll_wakes_on_a_partition_it_did_not_name(broker, client):
    """An incremental Fetch naming nothing still parks on every partition of its session
    and is answered with the one an append woke."""
    hws = _many_partitions_waiting(broker, client, "sess-wide", 300)
    sid = _session_fetch(client, "sess-wide", 0, 0, hws)["session_id"]
    producer = RawClient(broker.bootstrap)
    timer = threading.Timer(0.5, lambda: _produce_to(producer, "sess-wide", 137, make_batch([b"wake"])))
    timer.start()
    try:
        listed = _listed(_session_fetch(client, "sess-wide", sid, 1, max_wait=30000, min_bytes=1))
    finally:
        timer.join()
        producer.close()
    assert list(listed) == [137]
    assert [(r.offset, r.value) for r in iter_records(bytes(listed[137]["records"]))] == [(hws[137], b"wake")]


def test_a_large_request_trickling_in_and_small_ones_after_it(broker, client):
    """Receive low-water marks (broker/server.py): a 3 MiB Produce arriving in pieces
    with pauses is appended whole, the small requests after it on the same connection
    are answered (a low-water mark left at the large frame's size would never wake for
    them), and a large frame cut short by its client costs only that connection."""
    create_topic(client, "lowat", {"max.message.bytes": str(8 << 20)})
    values = [bytes([i % 251]) * 30_000 for i in range(100)]
    records = bytes(make_batch(values, batch_size=8 << 20))
    data = client.send_only(ApiKey.PRODUCE, 9, {"acks": 1, "timeout_ms": 5000, "topic_data": [
        {"name": "lowat", "partition_data": [{"index": 0, "records": records}]}]}, piece=700_000, pause=0.1)
    assert len(data) > 2_900_000
    answer = client.receive()["responses"][0]["partition_responses"][0]
    assert (answer["error_code"], answer["base_offset"]) == (0, 0), answer
    for _ in range(3):
        assert client.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                       "client_software_version": "1"})["error_code"] == 0
    assert end_offset(client, "lowat") == 100
    assert [r.value for r in iter_records(bytes(_fetch(client, "lowat", 0, partition_max=8 << 20)["records"]))] \
        == values

    cut = RawClient(broker.bootstrap)
    cut.send_raw(data[:500_000])   # 2.5 MiB never follow
    time.sleep(0.2)
    cut.close()
    assert end_offset(client, "lowat") == 100
    assert broker.proc.poll() is None
