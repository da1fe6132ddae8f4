"""Followers of a compacted topic (issue 12): they replicate the leader's log by fetching as
always, across the offset gaps its cleaner leaves, and a follower that was down while the
leader cleaned catches up from a cleaned range. The compose cluster as local processes."""
from __future__ import annotations

import time

import pytest

from protocol.records import build_batch, iter_records

from tests.e2e.rawclient import RawClient, produce

from .conftest import ComposeCluster, wait_for

KEYS = 200


@pytest.fixture
def fast_cleaner_cluster(tmp_path):
    c = ComposeCluster(tmp_path)
    for n in c.nodes.values():
        n.env["CANOPY_LOG_CLEANER_BACKOFF_MS"] = "300"
    try:
        c.start()
        yield c
    finally:
        c.stop()


def read_replica(bootstrap: str, topic: str, end: int, timeout: float = 60) -> list:
    """Every record one broker serves from offset 0 up to ``end`` (no redirects), fetching
    across gaps: [(offset, key, value)]."""
    c = RawClient(bootstrap)
    out, offset = [], 0
    deadline = time.monotonic() + timeout
    try:
        while offset < end:
            assert time.monotonic() < deadline, f"only up to {offset} of {end} from {bootstrap}"
            r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 200, "min_bytes": 1, "max_bytes": 8 << 20,
                                  "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                      {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 4 << 20}]}]})
            p = r["responses"][0]["partitions"][0]
            assert p["error_code"] == 0, p
            for rec in iter_records_all(bytes(p["records"])):
                if rec.offset >= offset:
                    out.append((rec.offset, rec.key, rec.value))
                    offset = rec.offset + 1
    finally:
        c.close()
    return out


def iter_records_all(buf: bytes):
    from protocol.records import BatchHeader
    pos = 0
    while pos + 61 <= len(buf):
        h = BatchHeader.parse(buf, pos)
        if pos + h.total_size > len(buf):
            break
        yield from iter_records(buf, pos)
        pos += h.total_size


def latest(records) -> dict:
    out = {}
    for off, k, v in records:
        out[k] = (off, v)
    return out


def test_follower_catches_up_across_a_cleaned_range(fast_cleaner_cluster):
    cluster = fast_cleaner_cluster
    cluster.create_topic("changelog", configs={"cleanup.policy": "compact", "segment.bytes": str(64 << 10),
                                               "min.cleanable.dirty.ratio": "0.01", "min.insync.replicas": "1"})
    leader, _, replicas, _ = cluster.metadata("changelog")[0]
    behind = replicas[-1]          # a leaf of the tree
    cluster.nodes[behind].kill9()
    c = RawClient(cluster.nodes[leader].bootstrap)
    written = []
    try:
        for i in range(200):
            recs = [(b"k%03d" % ((i * 50 + j) % KEYS), b"v%05d" % (i * 50 + j), [], None) for j in range(50)]
            r = produce(c, "changelog", build_batch(recs), acks=1)
            assert r["error_code"] == 0, r
            written += [(r["base_offset"] + j, k, v) for j, (k, v, _, _) in enumerate(recs)]
    finally:
        c.close()
    end = written[-1][0] + 1
    want = latest(written)
    leader_log = cluster.nodes[leader].log_text
    wait_for(lambda: "cleaned changelog-0" in leader_log(), "the leader to clean", timeout=60)
    wait_for(lambda: len(read_replica(cluster.nodes[leader].bootstrap, "changelog", end)) < len(written) // 2,
             "the leader's log to shrink", timeout=60)
    # The follower comes back behind a cleaned range and replicates the gaps as they are.
    cluster.nodes[behind].start()
    cluster.nodes[behind].wait_listening()
    wait_for(lambda: cluster.log_end_offset(behind, "changelog") == end, "the follower caught up", timeout=90)
    for node in cluster.nodes:
        got = read_replica(cluster.nodes[node].bootstrap, "changelog", end)
        assert latest(got) == want, f"node {node}"
        # whatever a replica kept is an original record at its original offset
        assert set(got) <= set(written), f"node {node}"
    # a restart of the follower recovers its sparse segments unchanged
    before = read_replica(cluster.nodes[behind].bootstrap, "changelog", end)
    assert len(before) < len(written) // 2    # its log has the gaps
    cluster.nodes[behind].kill9()
    cluster.nodes[behind].start()
    cluster.nodes[behind].wait_listening()
    wait_for(lambda: cluster.log_end_offset(behind, "changelog") == end, "the follower back", timeout=60)
    after = read_replica(cluster.nodes[behind].bootstrap, "changelog", end)
    assert latest(after) == latest(before) == want
    assert "truncated a torn" not in cluster.nodes[behind].log_text()
