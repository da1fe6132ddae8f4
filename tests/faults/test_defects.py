"""Issue 10's storage/fetch defects, each proven on real `canopy serve` processes."""
from __future__ import annotations

import pytest

from protocol.errors import ErrorCode
from protocol.records import iter_records
from tests.e2e.rawclient import RawClient, make_batch, produce

from .cluster import FaultCluster, wait_for

pytestmark = pytest.mark.timeout(300)


def fetch_at(bootstrap: str, topic: str, offset: int) -> dict:
    c = RawClient(bootstrap)
    try:
        r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": 1 << 20,
                              "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                  {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]})
    finally:
        c.close()
    return r["responses"][0]["partitions"][0]


def test_fetch_between_high_watermark_and_log_end_is_empty_not_out_of_range(tmp_path):
    """Defect 1: only offsets past the log end (or before the log start) are out of range.
    With the leader's children paused, acks=1 writes move the log end but not the HW; a
    consumer at an offset in between (where it stands after reading a failed leader's HW,
    or on a follower whose HW lags) gets an empty partition and keeps its position."""
    cluster = FaultCluster(tmp_path, 3, with_fiu=False, with_faketime=False).start()
    try:
        cluster.create_topic("hw", 1, {"min.insync.replicas": "1"})
        leader, _, replicas, _ = cluster.metadata("hw")[0]
        lead = cluster.nodes[leader]
        c = RawClient(lead.bootstrap)
        try:
            wait_for(lambda: produce(c, "hw", make_batch([b"a", b"b"]), acks=-1)["error_code"] == 0,
                     "first acks=all write")
            children = [cluster.nodes[r] for r in replicas[1:]]
            for ch in children:
                ch.pause()
            r = produce(c, "hw", make_batch([b"c", b"d", b"e"]), acks=1)
            assert r["error_code"] == 0, r
        finally:
            c.close()
        p = fetch_at(lead.bootstrap, "hw", 4)           # HW 2 < 4 < log end 5
        assert p["high_watermark"] == 2, p
        assert p["error_code"] == ErrorCode.NONE, p
        assert bytes(p["records"]) == b""
        assert fetch_at(lead.bootstrap, "hw", 5)["error_code"] == ErrorCode.NONE   # the log end itself
        assert fetch_at(lead.bootstrap, "hw", 6)["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE
        for ch in children:
            ch.resume()
        wait_for(lambda: fetch_at(lead.bootstrap, "hw", 4)["high_watermark"] == 5, "HW catching up")
        records = iter_records(bytes(fetch_at(lead.bootstrap, "hw", 4)["records"]))
        assert [r.value for r in records if r.offset >= 4] == [b"e"]   # (whole batches: c, d come too)
    finally:
        cluster.stop()


def test_failed_fsync_is_never_acknowledged_and_takes_the_log_offline(tmp_path):
    """Defect 6: with `--flush always`, a produce is acknowledged only after an fsync. When
    fdatasync fails (libfiu in the running broker), the waiting request must not be told
    success; the log goes offline (KAFKA_STORAGE_ERROR for writes and reads) and, after a
    restart, the broker serves again with every acknowledged record."""
    cluster = FaultCluster(tmp_path, 1, flush="always", with_faketime=False, min_insync=1)
    cluster.start()
    try:
        node = cluster.nodes[1]
        cluster.create_topic("sync", 1)
        c = RawClient(node.bootstrap)
        r = wait_for(lambda: produce(c, "sync", make_batch([b"durable"]), acks=-1), "first write")
        assert r["error_code"] == 0, r
        node.fiu("enable name=posix/io/sync/fdatasync,failinfo=5")
        try:
            answer = produce(c, "sync", make_batch([b"not durable"]), acks=-1)
        except AssertionError:   # connection closed: no answer, so no acknowledgement
            answer = None
        assert answer is None or answer["error_code"] != 0, f"acknowledged after a failed fsync: {answer}"
        c.close()
        c = RawClient(node.bootstrap)
        assert produce(c, "sync", make_batch([b"again"]), acks=-1)["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR
        assert fetch_at(node.bootstrap, "sync", 0)["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR
        c.close()
        node.fiu("disable name=posix/io/sync/fdatasync")
        assert node.alive
        log = node.log_tail()
        assert "offline" in log and "Traceback" not in log, log
        node.stop()
        node.start()
        node.wait_listening()
        first = wait_for(lambda: fetch_at(node.bootstrap, "sync", 0), "reads after the restart")
        assert first["error_code"] == 0, first
        values = [r.value for r in iter_records(bytes(first["records"]))]
        assert values[0] == b"durable"
        c = RawClient(node.bootstrap)
        assert produce(c, "sync", make_batch([b"after"]), acks=-1)["error_code"] == 0
        c.close()
    finally:
        cluster.stop()
