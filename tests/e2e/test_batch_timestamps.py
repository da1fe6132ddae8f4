"""Batches whose header a client filled wrongly (issue 14), and the old OffsetCommit /
OffsetFetch versions sarama uses, checked with a raw client against a real broker.

sarama 1.22 sends maxTimestamp -1; Kafka's LogValidator recomputes the field from the
records, so ListOffsets, the timestamp index and time retention see the true maximum.
"""
from __future__ import annotations

import struct
import time

from protocol.messages import ApiKey
from protocol.records import (CRC_OFFSET, MAX_TIMESTAMP_OFFSET, BatchHeader, build_batch,
                              compute_crc, iter_records, CODEC_GZIP)

from .rawclient import RawClient, create_topic, produce

T0 = 1_700_000_000_000


def _bad_header(stamps, max_ts=-1, codec=0) -> bytes:
    """A batch as sarama writes it: right records, maxTimestamp -1 (or any value), valid CRC."""
    b = bytearray(build_batch([(b"k%d" % i, b"v%d" % i, [], t) for i, t in enumerate(stamps)],
                              codec=codec))
    struct.pack_into(">q", b, MAX_TIMESTAMP_OFFSET, max_ts)
    struct.pack_into(">I", b, CRC_OFFSET, compute_crc(b, 0))
    return bytes(b)


def _list_offset(client, topic, ts) -> tuple[int, int]:
    r = client.request(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": ts,
                                         "current_leader_epoch": -1}]}]})
    p = r["topics"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return p["offset"], p["timestamp"]


def _fetch_all(client, topic) -> bytes:
    r = client.request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 24,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 24,
             "current_leader_epoch": -1, "log_start_offset": -1}]}]})
    return bytes(r["responses"][0]["partitions"][0]["records"])


# Three batches, the first two with broken headers: -1, and a max below the first record.
BATCHES = [
    ([T0 + 1000, T0 + 3000, T0 + 2000], dict(max_ts=-1)),
    ([T0 + 5000, T0 + 7000, T0 + 6000], dict(max_ts=T0 + 10, codec=CODEC_GZIP)),
    ([T0 + 8000, T0 + 9000], dict(max_ts=-1, codec=CODEC_GZIP)),
]
# (query, expected offset, expected timestamp): the first record with timestamp >= query.
EXPECTED = [
    (T0, 0, T0 + 1000), (T0 + 2500, 1, T0 + 3000), (T0 + 3001, 3, T0 + 5000),
    (T0 + 6500, 4, T0 + 7000), (T0 + 7001, 6, T0 + 8000), (T0 + 9000, 7, T0 + 9000),
    (T0 + 9001, -1, -1),
    (-3, 7, T0 + 9000),   # max timestamp (KIP-734)
]


def _check_answers(client, topic):
    for query, offset, ts in EXPECTED:
        assert _list_offset(client, topic, query) == (offset, ts), query


def test_max_timestamp_minus_one_is_recomputed_for_list_offsets_and_fetch(broker_factory):
    broker = broker_factory()
    client = RawClient(broker.bootstrap)
    create_topic(client, "sarama-like")
    for stamps, kw in BATCHES:
        r = produce(client, "sarama-like", _bad_header(stamps, **kw), version=7)
        assert r["error_code"] == 0, r
    _check_answers(client, "sarama-like")
    data = _fetch_all(client, "sarama-like")
    # Records keep their own timestamps; each header now carries its records' maximum.
    assert [r.timestamp for r in iter_records(data, 0)] == BATCHES[0][0]
    pos, heads = 0, []
    while pos < len(data):
        h = BatchHeader.parse(data, pos)
        assert compute_crc(data, pos) == h.crc
        heads.append(h)
        stamps = [r.timestamp for r in iter_records(data, pos)]
        assert h.max_timestamp == max(stamps) and h.timestamp_type == 0
        pos += h.total_size
    assert [[r.timestamp for r in iter_records(data, h.position)] for h in heads] == \
        [s for s, _ in BATCHES]
    client.close()
    # The index rebuilt from disk after a restart gives the same answers.
    broker.stop()
    broker.start()
    client = RawClient(broker.bootstrap)
    _check_answers(client, "sarama-like")
    client.close()


def test_time_retention_uses_recomputed_timestamps(broker_factory):
    # Records from 2023 with header -1: before the fix the segment looked timestamp-less
    # and retention fell back to the (fresh) file mtime, keeping it for retention.ms.
    broker = broker_factory(env={"CANOPY_RETENTION_CHECK_INTERVAL_MS": "200"})
    client = RawClient(broker.bootstrap)
    create_topic(client, "old-data", {"retention.ms": "3600000", "segment.bytes": "1024"})
    for i in range(4):
        r = produce(client, "old-data", _bad_header([T0 + i, T0 + i + 1]), version=7)
        assert r["error_code"] == 0
        # a fresh batch rolls the segment (each is ~100 bytes; 1 KiB segments)
    big = build_batch([(None, b"x" * 1100, [], int(time.time() * 1000))])
    assert produce(client, "old-data", big, version=7)["error_code"] == 0
    assert produce(client, "old-data", build_batch([(None, b"new", [], None)]), version=7)["error_code"] == 0
    deadline = time.monotonic() + 30
    earliest = 0
    while time.monotonic() < deadline:
        earliest, _ = _list_offset(client, "old-data", -2)
        if earliest >= 8:
            break
        time.sleep(0.2)
    assert earliest >= 8, "segments of 2023 records were not deleted by retention.ms"
    client.close()


def test_offset_commit_v0_v1_and_offset_fetch_v0_round_trip(broker):
    client = RawClient(broker.bootstrap)
    create_topic(client, "old-commits")
    for version, offset in ((0, 11), (1, 22)):
        body = {"group_id": "sarama-group", "generation_id_or_member_epoch": -1, "member_id": "",
                "topics": [{"name": "old-commits", "partitions": [
                    {"partition_index": 0, "committed_offset": offset, "commit_timestamp": -1,
                     "committed_metadata": f"v{version}"}]}]}
        r = client.request(ApiKey.OFFSET_COMMIT, version, body)
        assert r["topics"][0]["partitions"][0]["error_code"] == 0, r
        for fetch_version in (0, 1):
            f = client.request(ApiKey.OFFSET_FETCH, fetch_version, {
                "group_id": "sarama-group",
                "topics": [{"name": "old-commits", "partition_indexes": [0]}]})
            p = f["topics"][0]["partitions"][0]
            assert (p["committed_offset"], p["metadata"], p["error_code"]) == (offset, f"v{version}", 0)
    # advertised, so clients that negotiate pick them
    av = client.request(ApiKey.API_VERSIONS, 0, {})
    ranges = {a["api_key"]: (a["min_version"], a["max_version"]) for a in av["api_keys"]}
    assert ranges[ApiKey.OFFSET_COMMIT][0] == 0 and ranges[ApiKey.OFFSET_FETCH][0] == 0
    client.close()


def test_timestamp_bounds_reject_records_out_of_range(broker):
    # Kafka's message.timestamp.before/after.max.ms (3.6+, KIP-937) and the older
    # difference.max.ms: every record is checked, one bad record fails the whole batch.
    client = RawClient(broker.bootstrap)
    create_topic(client, "bounded", {"message.timestamp.before.max.ms": "3600000",
                                     "message.timestamp.after.max.ms": "60000"})
    create_topic(client, "bounded-old", {"message.timestamp.difference.max.ms": "60000"})
    create_topic(client, "unbounded")
    now = int(time.time() * 1000)
    ok = [now - 1_800_000, now, now + 30_000]
    too_old = [now, now - 7_200_000, now]               # record 1 older than one hour
    too_new = [now, now, now + 600_000]                 # record 2 ten minutes ahead
    r = produce(client, "bounded", _bad_header(ok, max_ts=max(ok)), version=9)
    assert r["error_code"] == 0, r
    for stamps, bad_index in ((too_old, 1), (too_new, 2)):
        # The header max is right for too_old and -1 for too_new: both are read per record.
        r = produce(client, "bounded", _bad_header(stamps, max_ts=-1 if bad_index == 2 else max(stamps)),
                    version=9)
        assert r["error_code"] == 32, r                  # INVALID_TIMESTAMP
        assert [e["batch_index"] for e in r["record_errors"]] == [bad_index], r
        assert "out of range" in r["error_message"]
    # difference.max.ms bounds both sides when the new settings are not set
    assert produce(client, "bounded-old", _bad_header(too_old), version=9)["error_code"] == 32
    assert produce(client, "bounded-old", _bad_header(too_new), version=9)["error_code"] == 32
    assert produce(client, "bounded-old", _bad_header([now - 30_000, now]), version=9)["error_code"] == 0
    # defaults (Kafka 3.x): no bound at all
    assert produce(client, "unbounded", _bad_header([1, 2]), version=9)["error_code"] == 0
    assert produce(client, "unbounded", _bad_header([now + 10**10]), version=9)["error_code"] == 0
    # rejected batches took no offsets
    assert _list_offset(client, "bounded", -1)[0] == len(ok)
    # a bad value is refused at creation, as Kafka does
    r = client.request(ApiKey.CREATE_TOPICS, 5, {"topics": [{
        "name": "bad-bound", "num_partitions": 1, "replication_factor": 1,
        "configs": [{"name": "message.timestamp.after.max.ms", "value": "-5"}]}], "timeout_ms": 5000})
    assert r["topics"][0]["error_code"] == 40, r        # INVALID_CONFIG
    client.close()
