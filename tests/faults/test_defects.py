"""Issue 10's storage/fetch defects, each proven on real `canopy serve` processes."""
from __future__ import annotations

import pytest

from protocol.errors import ErrorCode
from protocol.records import iter_records
from tests.e2e.rawclient import RawClient, init_producer_id, make_batch, produce

from .cluster import FaultCluster, wait_for
from .history import iter_all_records
from .pagecache import evict

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
        # The waiting request itself is told: KAFKA_STORAGE_ERROR, as Kafka answers.
        assert answer is not None and answer["error_code"] == ErrorCode.KAFKA_STORAGE_ERROR, \
            f"after a failed fsync: {answer}"
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
        # (Until the controller confirms its leadership after the restart, the broker
        # answers NOT_LEADER_OR_FOLLOWER, and clients retry.)
        first = wait_for(lambda: (lambda r: r if r["error_code"] == 0 else None)(
            fetch_at(node.bootstrap, "sync", 0)), "reads after the restart")
        assert first["error_code"] == 0, first
        values = [r.value for r in iter_records(bytes(first["records"]))]
        assert values[0] == b"durable"
        c = RawClient(node.bootstrap)
        assert produce(c, "sync", make_batch([b"after"]), acks=-1)["error_code"] == 0
        c.close()
    finally:
        cluster.stop()


def test_offline_log_answers_storage_error_before_the_sequence_check(tmp_path):
    """Once a log is offline every idempotent batch is answered KAFKA_STORAGE_ERROR, never
    OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka answers the latter (after an earlier refusal)
    by bumping its producer epoch and renumbering unacknowledged batches, which
    duplicated appended records in the disk-fsync-leader nemesis."""
    cluster = FaultCluster(tmp_path, 1, flush="always", with_faketime=False, min_insync=1)
    cluster.start()
    try:
        node = cluster.nodes[1]
        cluster.create_topic("idem-offline", 1)
        c = RawClient(node.bootstrap)
        pid, epoch = init_producer_id(c)

        def send(seq):
            return produce(c, "idem-offline", make_batch([b"s%d" % seq], producer_id=pid, producer_epoch=epoch,
                                                         base_sequence=seq), acks=-1)["error_code"]

        assert wait_for(lambda: send(0) == 0, "a first idempotent write") is not False
        node.fiu("enable name=posix/io/sync/fdatasync,failinfo=5")
        try:
            # seq 1 is appended, then its fsync fails; seq 2 meets the offline log before
            # it is appended; seq 3 follows a batch that never reached the log.
            assert [send(1), send(2), send(3)] == [ErrorCode.KAFKA_STORAGE_ERROR] * 3
        finally:
            node.fiu("disable name=posix/io/sync/fdatasync")
        c.close()
    finally:
        cluster.stop()


def test_offset_commit_on_an_offline_offsets_log_answers_not_coordinator(tmp_path):
    """An offset commit whose append to ``__consumer_offsets`` meets a failed fsync is not
    acknowledged; Kafka's GroupMetadataManager answers it NOT_COORDINATOR (the client looks
    the coordinator up again and retries), not UNKNOWN_SERVER_ERROR with a traceback."""
    cluster = FaultCluster(tmp_path, 1, flush="always", with_faketime=False, min_insync=1)
    cluster.start()
    try:
        node = cluster.nodes[1]
        cluster.create_topic("commits", 1)

        def commit(offset):
            c = RawClient(node.bootstrap)
            try:
                r = c.request(8, 8, {"group_id": "g-offline", "generation_id_or_member_epoch": -1,
                                     "member_id": "", "group_instance_id": None, "topics": [
                                         {"name": "commits", "partitions": [
                                             {"partition_index": 0, "committed_offset": offset,
                                              "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
            finally:
                c.close()
            return r["topics"][0]["partitions"][0]["error_code"]

        assert wait_for(lambda: commit(1) == 0, "a first commit") is not False
        node.fiu("enable name=posix/io/sync/fdatasync,failinfo=5")
        try:
            assert commit(2) == ErrorCode.NOT_COORDINATOR
        finally:
            node.fiu("disable name=posix/io/sync/fdatasync")
        log = node.log_tail()
        assert "not acknowledged" in log and "Traceback" not in log, log
    finally:
        cluster.stop()


def _read_values(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    c = RawClient(bootstrap)
    try:
        r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                              "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                  {"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    finally:
        c.close()
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return [rec.value for rec in iter_all_records(bytes(p["records"] or b""))]


def _replica_read(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record up to the log end, read as a replica that is not in
    the partition's tree would (replica_id 99: nobody's child, so no follower state moves)."""
    c = RawClient(bootstrap)
    try:
        r = c.request(1, 12, {"replica_id": 99, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                              "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [
                                  {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    finally:
        c.close()
    p = r["responses"][0]["partitions"][0]
    assert p["error_code"] == 0, p
    return [(rec.offset, rec.value) for rec in iter_all_records(bytes(p["records"] or b""))]


DAMAGE = {
    "empty": lambda text: "",
    "torn": lambda text: text[: len(text) // 2],
    "garbage": lambda text: "\x00\x17{not json",
    "wrong types": lambda text: text.replace('"partitions": ', '"partitions": "x", "was": '),
    "bad topic id": lambda text: text.replace('"topic_id": "', '"topic_id": "zz'),
}


def test_damaged_topic_json_is_rebuilt_or_offline_never_a_crash(tmp_path):
    """Defect 11: a damaged topic.json used to stop the broker with a traceback, leaving
    every topic unreachable. Now the topic is rebuilt from its directory (partition
    logs kept), one ERROR line names the file, and every other topic is served; a
    topic with nothing to rebuild from is offline, the rest still served."""
    from tests.e2e.conftest import BrokerProcess
    from tests.e2e.rawclient import create_topic

    b = BrokerProcess(tmp_path / "data", extra_args=["--num-partitions", "1"]).start()
    try:
        c = RawClient(b.bootstrap)
        for t in ("hurt", "fine"):
            create_topic(c, t)
            assert produce(c, t, make_batch([t.encode() + b"-1", t.encode() + b"-2"]))["error_code"] == 0
        c.close()
        meta = tmp_path / "data" / "topics" / "hurt" / "topic.json"
        good = meta.read_text()
        expected = [b"hurt-1", b"hurt-2"]
        for name, damage in DAMAGE.items():
            b.stop()
            meta.write_text(damage(good))
            b.start()
            assert _read_values(b.bootstrap, "hurt") == expected, name
            assert _read_values(b.bootstrap, "fine") == [b"fine-1", b"fine-2"], name
            log = b.log_text()
            assert "Traceback" not in log, log
            assert f"{meta} is damaged" in log, (name, log)
            c = RawClient(b.bootstrap)
            assert produce(c, "hurt", make_batch([b"more"]))["error_code"] == 0, name
            expected.append(b"more")
            c.close()
            good = meta.read_text()   # the rebuilt file
        # Nothing to rebuild from: offline, one line, the rest served.
        b.stop()
        gone = tmp_path / "data" / "topics" / "gone"
        (gone).mkdir()
        (gone / "topic.json").write_text("{")
        (tmp_path / "data" / "producer_ids.json").write_text("")
        b.start()
        assert _read_values(b.bootstrap, "fine") == [b"fine-1", b"fine-2"]
        log = b.log_text()
        assert f"{gone / 'topic.json'} is damaged" in log and "topic gone is offline" in log, log
        assert "producer_ids.json is damaged" in log, log
        assert "Traceback" not in log, log
    finally:
        b.stop()


def test_damaged_topic_json_in_a_cluster_keeps_the_cluster_topic_id(tmp_path):
    """Rebuilt on a cluster member, the topic takes its id from the metadata log: with a
    new id the broker would take it for a deleted-and-recreated topic and drop its data."""
    cluster = FaultCluster(tmp_path, 3, with_fiu=False, with_faketime=False).start()
    try:
        cluster.create_topic("kept", 1, {"min.insync.replicas": "2", "retention.ms": "123456789"})
        leader, _, replicas, _ = cluster.metadata("kept")[0]
        c = RawClient(cluster.nodes[leader].bootstrap)
        try:
            wait_for(lambda: produce(c, "kept", make_batch([b"x%d" % i for i in range(50)]), acks=-1)["error_code"] == 0,
                     "acks=all write")
        finally:
            c.close()
        victim = cluster.nodes[replicas[-1]]
        wait_for(lambda: len(_read_values(victim.bootstrap, "kept")) == 50, "replicated")
        victim.stop()
        meta = victim.data_dir / "topics" / "kept" / "topic.json"
        before = meta.read_text()
        meta.write_text("")
        victim.start()
        victim.wait_listening()
        wait_for(lambda: len(_read_values(victim.bootstrap, "kept")) == 50, "served after the rebuild")
        import json as _json
        assert _json.loads(meta.read_text()) == _json.loads(before)
        log = victim.log_tail(20000)
        assert "topic id and configs from the cluster metadata" in log, log
        assert "deleted topic kept" not in log and "Traceback" not in log, log
    finally:
        cluster.stop()


def test_event_loop_does_no_blocking_disk_work(tmp_path):
    """Defect 12: disk work on the broker's event loop stalls every connection. Watched
    with strace on the running broker (the event loop is the main thread, tid = pid):
    a Fetch of records that are not in the page cache has them read by a worker thread
    before sendfile copies them; DeleteRecords (the log start offset checkpoint) and
    DeleteTopics do no fsync on the event loop."""
    import re
    import subprocess
    import time

    from tests.e2e.conftest import BrokerProcess, require_tool
    from tests.e2e.rawclient import create_topic

    strace = require_tool("strace", "Debian package strace")
    b = BrokerProcess(tmp_path / "data").start()
    trace = tmp_path / "strace.out"
    tracer = None
    try:
        c = RawClient(b.bootstrap)
        create_topic(c, "cold")
        for i in range(24):
            assert produce(c, "cold", make_batch([bytes([i]) * 10_000] * 50))["error_code"] == 0
        segments = sorted((tmp_path / "data" / "topics" / "cold" / "0").glob("*.log"))
        evict(segments, segments[0], 4 << 20)
        tracer = subprocess.Popen([strace, "-f", "-qq", "-e", "trace=sendfile,pread64,fsync,fdatasync",
                                   "-p", str(b.proc.pid), "-o", str(trace)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)   # attached to every thread
        r = c.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20,
                              "session_id": 0, "session_epoch": -1, "topics": [{"topic": "cold", "partitions": [
                                  {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 64 << 20}]}]})
        assert len(bytes(r["responses"][0]["partitions"][0]["records"])) > 10 << 20
        r = c.request(21, 2, {"topics": [{"name": "cold", "partitions": [{"partition_index": 0, "offset": 600}]}],
                              "timeout_ms": 5000})
        assert r["topics"][0]["partitions"][0]["error_code"] == 0, r
        r = c.request(20, 4, {"topic_names": ["cold"], "timeout_ms": 5000})
        assert r["responses"][0]["error_code"] == 0, r
        c.close()
        time.sleep(1)
    finally:
        if tracer is not None:
            tracer.terminate()
            tracer.wait(10)
        b.stop()
    main = b.proc.pid
    calls = []   # (tid, syscall, first argument)
    for line in trace.read_text().splitlines():
        m = re.match(r"(\d+)\s+(\w+)\((\d+)", line)
        if m:
            calls.append((int(m.group(1)), m.group(2), int(m.group(3))))
    on_loop = [c for c in calls if c[0] == main and c[1] in ("fsync", "fdatasync")]
    assert not on_loop, f"fsync on the event loop: {on_loop[:5]}"
    sends = [i for i, c in enumerate(calls) if c[0] == main and c[1] == "sendfile"]
    assert sends, calls[:20]
    first = sends[0]
    in_fd = int(re.search(r"sendfile\(\d+, (\d+)", [ln for ln in trace.read_text().splitlines()
                                                     if "sendfile(" in ln][0]).group(1))
    warmed = [c for c in calls[:first] if c[0] != main and c[1] == "pread64" and c[2] == in_fd]
    assert warmed, f"sendfile of cold pages on the event loop without a worker reading them first: {calls[:20]}"


def test_replica_fetch_past_its_epoch_end_gets_the_diverging_epoch(tmp_path):
    """Defect 9 (KIP-320/595): a replica's Fetch carries the epoch of its last batch; when
    the upstream's log ends that epoch before the fetch offset, the replica holds a tail
    that never existed upstream, and the answer must say so (diverging_epoch) instead of
    handing it records to append after that tail. Here the old leader's epoch-0 tail is
    offered to the new leader (epoch 1) by a replica that claims to have fetched it."""
    cluster = FaultCluster(tmp_path, 3, with_fiu=False, with_faketime=False).start()
    try:
        cluster.create_topic("div", 1, {"min.insync.replicas": "1"})
        old_leader, _, replicas, _ = cluster.metadata("div")[0]
        c = RawClient(cluster.nodes[old_leader].bootstrap)
        try:
            wait_for(lambda: produce(c, "div", make_batch([b"e0-%d" % i for i in range(10)]), acks=-1)["error_code"] == 0,
                     "epoch-0 writes")
        finally:
            c.close()
        cluster.nodes[old_leader].kill9()
        wait_for(lambda: cluster.metadata("div")[0][0] not in (old_leader, -1), "failover", timeout=60)
        new_leader, epoch, _, _ = cluster.metadata("div")[0]
        assert epoch >= 1
        lead = cluster.nodes[new_leader]
        c = RawClient(lead.bootstrap)
        try:
            wait_for(lambda: produce(c, "div", make_batch([b"e1-%d" % i for i in range(5)]), acks=1)["error_code"] == 0,
                     "writes in the new epoch")
            r = c.request(1, 12, {"replica_id": old_leader, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                  "session_id": 0, "session_epoch": -1, "topics": [{"topic": "div", "partitions": [
                                      {"partition": 0, "fetch_offset": 12, "current_leader_epoch": epoch,
                                       "last_fetched_epoch": 0, "log_start_offset": 0,
                                       "partition_max_bytes": 1 << 20}]}]})
        finally:
            c.close()
        p = r["responses"][0]["partitions"][0]
        assert p["error_code"] == 0, p
        assert p["diverging_epoch"] == {"epoch": 0, "end_offset": 10}, p
        assert not bytes(p["records"] or b""), "records offered to a diverged replica"
        # The killed leader comes back as a follower and ends with the new leader's bytes.
        cluster.nodes[old_leader].start()
        cluster.nodes[old_leader].wait_listening()
        # Compared as a replica reads them (up to the log end: the bytes themselves, not
        # how far a follower's high watermark has travelled yet).
        want = _replica_read(lead.bootstrap, "div")
        assert len(want) == 15, want
        wait_for(lambda: _replica_read(cluster.nodes[old_leader].bootstrap, "div") == want, "old leader converging",
                 timeout=60)
    finally:
        cluster.stop()
