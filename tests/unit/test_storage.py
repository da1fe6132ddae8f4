"""storage.Log on real files: appends, reads, rolls, timestamps, retention, recovery."""

import os
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from protocol import records as R
from protocol.records import build_batch, iter_records
from storage import DataDirLock, DataDirLocked, Log, LogConfig, OffsetOutOfRange
from storage.segment import INDEX_HEADER_SIZE, segment_name
from tests.faults.pagecache import cached_bytes, evict


def batch(n=3, ts=1000, value=b"v" * 100, codec=0, step=1):
    return build_batch([(b"k%d" % i, value, [], ts + i * step) for i in range(n)], codec=codec)


def offsets_of(data: bytes):
    out = []
    pos = 0
    while pos < len(data):
        h = R.BatchHeader.parse(data, pos)
        out.extend(r.offset for r in iter_records(data, pos))
        pos += h.total_size
    return out


def all_offsets(log, start=None):
    start = log.log_start_offset if start is None else start
    return offsets_of(log.read(start, 1 << 40).read_bytes())


def test_empty_log(tmp_path):
    log = Log(tmp_path / "p", LogConfig())
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert log.read(0, 1000).size == 0
    assert log.offset_for_timestamp(0) is None
    assert log.max_timestamp_offset() is None
    with pytest.raises(OffsetOutOfRange):
        log.read(1, 1000)
    log.close()


@pytest.mark.parametrize("new", [False, True], ids=["opened", "new"])
def test_log_never_written_has_no_files_until_its_first_append(tmp_path, new):
    """A new partition's directory and segment are made at its first append (a topic of
    1 000 partitions is created without 1 000 directories); until then it is an empty log,
    and a partition directory that is missing (a crash before that append) opens as one.
    ``new`` (CreateTopics, whose topic directory was just made) skips asking the disk."""
    d = tmp_path / "p"
    log = Log(d, LogConfig(), new=new)
    assert not d.exists() and not log.has_files
    assert log.read(0, 1000).size == 0
    assert log.flush() == 0 and log.maybe_roll(1 << 62) is False
    log.truncate_to(0)
    assert log.delete_records_before(0) == 0
    assert not d.exists()
    log.append(batch(3), leader_epoch=0)
    assert sorted(p.name for p in d.iterdir()) == [segment_name(0) + ".index", segment_name(0) + ".log"]
    assert log._parent_unsynced
    assert log.flush() == 3 and not log._parent_unsynced   # the directory's entry fsynced too
    log.close()
    assert all_offsets(Log(d, LogConfig())) == [0, 1, 2]


def test_files_made_ahead_are_taken_by_the_first_append(tmp_path):
    """make_files_ahead (a worker thread, after CreateTopics) leaves a directory and empty
    segment files; whatever state it stopped in, the log opens empty and its first append
    uses them; after the log has files it changes nothing."""
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    log.make_files_ahead()
    assert sorted(p.name for p in d.iterdir()) == [segment_name(0) + ".index", segment_name(0) + ".log"]
    log.append(batch(2), leader_epoch=0)
    log.make_files_ahead()
    log.close()
    assert all_offsets(Log(d, LogConfig())) == [0, 1]
    # A crash part-way: a directory alone, or a .log without its .index.
    for left in ([], [".log"]):
        q = tmp_path / ("q" + "".join(left))
        q.mkdir()
        for suffix in left:
            (q / (segment_name(0) + suffix)).touch()
        log = Log(q, LogConfig())
        assert (log.log_start_offset, log.log_end_offset) == (0, 0)
        log.append(batch(1), leader_epoch=0)
        log.close()
        assert all_offsets(Log(q, LogConfig())) == [0]


def test_log_never_written_follower_paths(tmp_path):
    """Replication may truncate or restart a never-written log before any append."""
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    log.truncate_fully_and_start_at(7)
    assert (log.log_start_offset, log.log_end_offset) == (7, 7) and d.is_dir()
    log.close()
    log = Log(d, LogConfig())
    assert (log.log_start_offset, log.log_end_offset) == (7, 7)
    log.close()
    log = Log(tmp_path / "q", LogConfig())
    data = bytearray(batch(2))
    struct.pack_into(">q", data, 0, 0)
    log.append_replicated(bytes(data))
    assert log.log_end_offset == 2 and all_offsets(log) == [0, 1]
    log.close()


def test_append_read_round_trip_across_rolls(tmp_path):
    cfg = LogConfig(segment_bytes=2000)
    log = Log(tmp_path / "p", cfg)
    expected = []
    for i in range(60):
        b = batch(n=1 + i % 4, ts=10_000 + i)
        r = log.append(b, leader_epoch=7)
        assert r.base_offset == (expected[-1] + 1 if expected else 0)
        expected.extend(range(r.base_offset, r.last_offset + 1))
    assert log.log_end_offset == len(expected)
    assert len(log.segments) > 5
    data = log.read(0, 1 << 30).read_bytes()
    assert offsets_of(data) == expected
    for h in R.validate_batches(data):
        assert h.partition_leader_epoch == 7
    # every offset is found inside its batch
    for off in range(0, len(expected), 7):
        data = log.read(off, 1).read_bytes()
        h = R.BatchHeader.parse(data)
        assert h.base_offset <= off <= h.last_offset
    log.close()
    log = Log(tmp_path / "p", cfg)
    assert log.log_end_offset == len(expected)
    assert all_offsets(log) == expected
    r = log.append(batch(), leader_epoch=8)
    assert r.base_offset == len(expected)
    log.close()


def test_read_limits_and_upper_offset(tmp_path):
    log = Log(tmp_path / "p", LogConfig())
    big = batch(n=1, value=b"x" * 5000)
    sizes = []
    for _ in range(3):
        log.append(big, leader_epoch=0)
        log.append(batch(n=2), leader_epoch=0)
        sizes += [len(big), len(batch(n=2))]
    # first batch whole even when bigger than max_bytes
    rr = log.read(0, 10)
    assert rr.size == sizes[0] and offsets_of(rr.read_bytes()) == [0]
    assert log.read(0, 10, min_one_batch=False).size == 0
    # then stop before exceeding max_bytes
    rr = log.read(0, sizes[0] + sizes[1] + 10)
    assert rr.size == sizes[0] + sizes[1]
    # fetch inside a batch returns the containing batch
    assert offsets_of(log.read(2, sizes[1]).read_bytes()) == [1, 2]
    # upper offset (high watermark) withholds batches starting at/after it
    assert offsets_of(log.read(0, 1 << 20, upper_offset=3).read_bytes()) == [0, 1, 2]
    assert offsets_of(log.read(0, 1 << 20, upper_offset=4).read_bytes()) == [0, 1, 2, 3]
    assert log.read(3, 1 << 20, upper_offset=3).size == 0
    # fetch at the log end offset: empty; beyond: out of range
    assert log.read(log.log_end_offset, 100).size == 0
    with pytest.raises(OffsetOutOfRange):
        log.read(log.log_end_offset + 1, 100)
    log.close()


def test_regions_are_sendfile_ready(tmp_path):
    import socket
    log = Log(tmp_path / "p", LogConfig(segment_bytes=1500))
    for i in range(10):
        log.append(batch(), leader_epoch=0)
    rr = log.read(0, 1 << 20)
    assert len(rr.regions) > 1
    a, b = socket.socketpair()
    try:
        for fd, pos, size in rr.regions:
            while size:
                n = os.sendfile(a.fileno(), fd, pos, size)
                pos += n
                size -= n
        a.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := b.recv(65536):
            got += chunk
    finally:
        a.close(); b.close()
    assert got == rr.read_bytes()
    log.close()


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_offset_for_timestamp_exact_inside_compressed_batches(tmp_path, codec):
    log = Log(tmp_path / "p", LogConfig(segment_bytes=3000))
    # non-monotonic timestamps within and across batches
    stamps = [[50, 10, 30], [20, 70, 60], [65, 90, 80], [85, 100, 95]]
    for s in stamps * 3:
        log.append(build_batch([(None, b"v" * 50, [], t) for t in s], codec=codec), leader_epoch=0)
    flat = [t for s in stamps * 3 for t in s]
    for target in range(0, 110, 5):
        want = next(((i, t) for i, t in enumerate(flat) if t >= target), None)
        assert log.offset_for_timestamp(target) == want, target
    assert log.max_timestamp_offset() == (flat.index(100), 100)
    log.close()


def test_offset_for_timestamp_with_kafka_python_batches(tmp_path):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    log = Log(tmp_path / "p", LogConfig())
    flat = []
    for b_i in range(5):
        bld = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 1 << 20)  # gzip
        for i in range(20):
            ts = 1000 + ((b_i * 20 + i) * 37) % 200
            bld.append(i, timestamp=ts, key=None, value=b"z" * 40, headers=[])
            flat.append(ts)
        log.append(bytes(bld.build()), leader_epoch=0)
    for target in (0, 1000, 1100, 1150, 1199, 1200):
        want = next(((i, t) for i, t in enumerate(flat) if t >= target), None)
        assert log.offset_for_timestamp(target) == want
    m = max(flat)
    assert log.max_timestamp_offset() == (flat.index(m), m)
    log.close()


def test_log_append_time_batches(tmp_path):
    log = Log(tmp_path / "p", LogConfig())
    b = bytearray(batch(n=4, ts=5))
    R.set_log_append_time(b, 0, 777)
    r = log.append(b, leader_epoch=0)
    assert r.max_timestamp == 777
    assert log.offset_for_timestamp(6) == (0, 777)
    assert log.max_timestamp_offset() == (0, 777)
    log.close()


def test_max_message_bytes(tmp_path):
    log = Log(tmp_path / "p", LogConfig(max_message_bytes=200))
    with pytest.raises(R.InvalidRecordBatch) as e:
        log.append(batch(n=5), leader_epoch=0)
    assert e.value.error_code == R.MESSAGE_TOO_LARGE
    log.close()


def test_batch_bigger_than_segment(tmp_path):
    log = Log(tmp_path / "p", LogConfig(segment_bytes=1024))
    log.append(batch(n=1), leader_epoch=0)
    log.append(batch(n=1, value=b"y" * 5000), leader_epoch=0)
    log.append(batch(n=1), leader_epoch=0)
    assert all_offsets(log) == [0, 1, 2]
    log.close()
    assert all_offsets(Log(tmp_path / "p", LogConfig(segment_bytes=1024))) == [0, 1, 2]


def test_segment_ms_roll(tmp_path):
    log = Log(tmp_path / "p", LogConfig(segment_ms=1000))
    seg0 = log.active_segment
    log.append(batch(), leader_epoch=0, now_ms=seg0.created_ms + 10)
    log.append(batch(), leader_epoch=0, now_ms=seg0.created_ms + 500)
    assert len(log.segments) == 1
    log.append(batch(), leader_epoch=0, now_ms=seg0.created_ms + 1500)
    assert len(log.segments) == 2 and log.active_segment.base_offset == 6
    assert log.maybe_roll(log.active_segment.created_ms + 5000)
    assert len(log.segments) == 3
    log.close()


def test_retention_by_time_and_size_survives_reopen(tmp_path):
    cfg = LogConfig(segment_bytes=1500, retention_ms=10_000)
    log = Log(tmp_path / "p", cfg)
    for i in range(20):
        log.append(batch(ts=1000 + i * 1000), leader_epoch=0)
    nseg = len(log.segments)
    # now = 25_000: segments whose newest record is older than 15_000 go
    deleted = log.enforce_retention(25_000)
    assert deleted > 0 and len(log.segments) == nseg - deleted
    assert log.log_start_offset == log.segments[0].base_offset > 0
    assert max(s.max_timestamp for s in log.segments[:1]) >= 15_000 or len(log.segments) == 1
    start = log.log_start_offset
    with pytest.raises(OffsetOutOfRange):
        log.read(start - 1, 100)
    # size
    log.config.retention_ms = -1
    log.config.retention_bytes = 2000
    log.enforce_retention(25_000)
    assert log.size_bytes - log.segments[0].size < 2000
    assert len(log.segments) >= 1
    start = log.log_start_offset
    end = log.log_end_offset
    log.close()
    log = Log(tmp_path / "p", cfg)
    assert (log.log_start_offset, log.log_end_offset) == (start, end)
    assert all_offsets(log) == list(range(start, end))
    # never deletes the active segment; an expired one is rolled by segment.ms
    # (Kafka's behaviour), and the next pass deletes it
    log.config.retention_ms = 0
    log.config.segment_ms = 10
    log.enforce_retention(10 ** 13)
    assert len(log.segments) == 2 and log.log_end_offset == end
    assert log.enforce_retention(10 ** 13) == 1
    assert len(log.segments) == 1 and log.log_start_offset == log.log_end_offset == end
    assert log.read(end, 100).size == 0
    log.close()


def test_delete_records_before(tmp_path):
    cfg = LogConfig(segment_bytes=1500)
    log = Log(tmp_path / "p", cfg)
    for i in range(20):
        log.append(batch(), leader_epoch=0)
    nseg = len(log.segments)
    assert log.delete_records_before(31) == 31
    assert len(log.segments) < nseg
    assert log.segments[0].base_offset <= 31 < log.segments[0].next_offset
    with pytest.raises(OffsetOutOfRange):
        log.read(30, 100)
    # reading at the log start offset gives the batch containing it
    assert offsets_of(log.read(31, 1).read_bytes())[0] == 30
    assert log.offset_for_timestamp(0) == (31, 1001)
    assert log.delete_records_before(5) == 31  # never goes backwards
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(log.log_end_offset + 1)
    log.close()
    log = Log(tmp_path / "p", cfg)
    assert log.log_start_offset == 31
    assert log.delete_records_before(60) == 60
    assert log.read(60, 100).size == 0 and log.log_end_offset == 60
    log.close()


def test_truncate_to(tmp_path):
    cfg = LogConfig(segment_bytes=1500)
    log = Log(tmp_path / "p", cfg)
    for i in range(20):
        log.append(batch(), leader_epoch=0)
    log.truncate_to(31)  # mid-batch: the whole batch [30..32] goes
    assert log.log_end_offset == 30
    assert all_offsets(log) == list(range(30))
    r = log.append(batch(), leader_epoch=1)
    assert r.base_offset == 30
    log.truncate_to(12)
    assert log.log_end_offset == 12
    log.close()
    log = Log(tmp_path / "p", cfg)
    assert log.log_end_offset == 12 and all_offsets(log) == list(range(12))
    log.delete_records_before(6)
    log.truncate_to(3)  # below the log start offset: restart empty there
    assert (log.log_start_offset, log.log_end_offset) == (3, 3)
    log.append(batch(), leader_epoch=0)
    assert all_offsets(log) == [3, 4, 5]
    log.close()


def test_append_replicated_keeps_bytes(tmp_path):
    src = Log(tmp_path / "a", LogConfig(segment_bytes=2000))
    for i in range(15):
        src.append(batch(codec=i % 5), leader_epoch=3)
    data = src.read(0, 1 << 30).read_bytes()
    dst = Log(tmp_path / "b", LogConfig(segment_bytes=2000))
    half = R.split_batches(data)[7][0]
    dst.append_replicated(data[:half])
    r = dst.append_replicated(data[half:])
    assert r.last_offset == src.log_end_offset - 1
    assert dst.read(0, 1 << 30).read_bytes() == data
    with pytest.raises(R.InvalidRecordBatch):
        dst.append_replicated(data[:half])  # offsets below the log end offset
    src.close(); dst.close()


def test_iter_batch_headers(tmp_path):
    log = Log(tmp_path / "p", LogConfig(segment_bytes=3000))
    for i in range(30):
        b = build_batch([(None, b"x" * 100, [], 5)] * 2, producer_id=9, producer_epoch=0,
                        base_sequence=2 * i)
        log.append(b, leader_epoch=0)
    hs = list(log.iter_batch_headers())
    assert [h.base_sequence for h in hs] == list(range(0, 60, 2))
    assert [h.base_offset for h in hs] == list(range(0, 60, 2))
    assert [h.base_offset for h in log.iter_batch_headers(from_offset=41)][0] == 40
    log.close()


def test_iter_batch_headers_large_and_small_batches(tmp_path):
    # batches above 16 KiB are read header by header, small ones in chunks: same headers
    log = Log(tmp_path / "p", LogConfig(segment_bytes=200_000))
    for i in range(40):
        n = 50 if i % 3 == 0 else 1
        b = build_batch([(None, os.urandom(1000), [], 5 + i)] * n, producer_id=9, producer_epoch=0,
                        base_sequence=1000 * i)
        log.append(b, leader_epoch=i // 10)
    assert len(log.segments) > 2
    want = [(h.base_offset, h.base_sequence, h.partition_leader_epoch, h.max_timestamp, h.crc)
            for h in R.validate_batches(log.read(0, 1 << 30).read_bytes(), strict=False)]
    got = [(h.base_offset, h.base_sequence, h.partition_leader_epoch, h.max_timestamp, h.crc)
           for h in log.iter_batch_headers()]
    assert got == want and len(got) == 40
    log.close()


def test_reopening_reads_only_the_tail_it_verifies(tmp_path):
    """A reopened segment re-checks its last 64 KiB (and the batch they end in), and reads
    only those: a plain fault in the mapping read the kernel's window around it instead,
    half of read_ahead_kb behind the page, which on the CI VM's disk (8 MiB read-ahead)
    was ~4 MiB per segment at every start, before any request."""
    log = Log(tmp_path / "p", LogConfig(segment_bytes=64 << 20))
    for i in range(24):    # 24 batches of ~512 KiB: a 12 MiB segment
        log.append(build_batch([(None, os.urandom(1 << 10), [], i)] * 512), leader_epoch=0)
    log.close()
    seg = sorted((tmp_path / "p").glob("*.log"))[-1]
    size = seg.stat().st_size
    evict([seg, seg.with_suffix(".index")], seg, size - 1)
    before = cached_bytes(seg)   # a page the eviction skipped stays (tests/faults/pagecache.py)
    assert before < 256 << 10
    log = Log(tmp_path / "p", LogConfig(segment_bytes=64 << 20))
    try:
        verified = log.segments[-1].recovery_verified_bytes
        assert 64 << 10 < verified <= (64 << 10) + (1 << 20)
        # what was verified, rounded out to pages, and nothing around it
        assert cached_bytes(seg) <= before + verified + 2 * 4096
        assert log.log_end_offset == 24 * 512
    finally:
        log.close()


def test_reopening_reads_only_the_index_pages_it_checks(tmp_path):
    """Recovery bisects the index and checks its last 4 096 entries: a small-batch
    segment's index is megabytes, and reading the kernel's window around each probe read
    all of it at every start (7.8 MB for 245 000 one-record batches)."""
    log = Log(tmp_path / "p", LogConfig(segment_bytes=64 << 20))
    for i in range(40_000):
        log.append(build_batch([(None, b"v", [], i)]), leader_epoch=0)
    log.close()
    seg = sorted((tmp_path / "p").glob("*.log"))[-1]
    index = seg.with_suffix(".index")
    assert index.stat().st_size >= 40_000 * 32
    evict([seg, index], index, 0)
    before = cached_bytes(index)   # a page the eviction skipped stays (tests/faults/pagecache.py)
    assert before < 64 << 10
    log = Log(tmp_path / "p", LogConfig(segment_bytes=64 << 20))
    try:
        # the entries checked (128 KiB), the bisections' pages and the header
        assert cached_bytes(index) <= before + (128 << 10) + 40 * 4096
        assert log.log_end_offset == 40_000
        assert log.offset_for_timestamp(20_000)[0] == 20_000   # and the index serves lookups
    finally:
        log.close()


# -- recovery -------------------------------------------------------------------

def _seg_files(d):
    logs = sorted(p for p in d.iterdir() if p.suffix == ".log")
    return logs[-1], logs[-1].with_suffix(".index")


def _crash(log):
    """Simulate kill -9: drop the object without close()/flush (fds closed only)."""
    for s in log._segments:
        s.close()


def _reboot(d):
    """Make the segments look written in an earlier boot (a machine crash):
    recovery must then distrust everything past the flushed length."""
    for idx in d.glob("*.index"):
        with open(idx, "r+b") as f:
            f.seek(40)
            f.write(b"\xee" * 16)


def test_recovery_ignores_garbage_past_committed_length(tmp_path):
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    for i in range(10):
        log.append(batch(), leader_epoch=0)
    end = log.log_end_offset
    size = log.active_segment.size
    seg_log, _ = _seg_files(d)
    _crash(log)
    # a torn write: half a batch plus garbage after the committed length
    with open(seg_log, "r+b") as f:
        f.seek(size)
        f.write(batch()[:40] + os.urandom(3000))
    log = Log(d, LogConfig())
    assert log.log_end_offset == end
    assert all_offsets(log) == list(range(end))
    assert os.path.getsize(seg_log) >= size
    r = log.append(batch(), leader_epoch=0)
    assert r.base_offset == end and all_offsets(log) == list(range(end + 3))
    log.close()


def test_recovery_of_unflushed_tail_with_torn_batch(tmp_path):
    """Machine-crash model: the committed length reached disk, the data did not
    entirely — CRC checks of the unflushed tail cut it at the first bad batch."""
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    for i in range(5):
        log.append(batch(), leader_epoch=0)
    log.flush()
    flushed_end, flushed_size = log.log_end_offset, log.active_segment.size
    for i in range(5):
        log.append(batch(), leader_epoch=0)
    seg_log, _ = _seg_files(d)
    total = log.active_segment.size
    _crash(log)
    one = len(batch())
    with open(seg_log, "r+b") as f:
        # 7th batch partially lost (zeros, as after a power cut); 8th-10th intact
        f.seek(flushed_size + one + 20)
        f.write(b"\0" * 30)
    _reboot(d)
    log = Log(d, LogConfig())
    assert log.recovered_truncations == 1
    assert log.log_end_offset == flushed_end + 3
    assert all_offsets(log) == list(range(flushed_end + 3))
    assert os.path.getsize(seg_log) < total + 1 or log.active_segment.size == flushed_size + one
    log.close()


def test_recovery_rebuilds_zeroed_index(tmp_path):
    d = tmp_path / "p"
    cfg = LogConfig(segment_bytes=2500)
    log = Log(d, cfg)
    for i in range(30):
        log.append(batch(ts=i), leader_epoch=0)
    end = log.log_end_offset
    log.close()
    for idx in d.glob("*.index"):
        with open(idx, "r+b") as f:
            f.write(b"\0" * os.path.getsize(idx))
    log = Log(d, cfg)
    assert log.log_end_offset == end
    assert all_offsets(log) == list(range(end))
    assert log.offset_for_timestamp(20) == (56, 20)  # batch 18 holds ts 18,19,20
    log.close()
    # and a missing index altogether
    for idx in d.glob("*.index"):
        idx.unlink()
    log = Log(d, cfg)
    assert all_offsets(log) == list(range(end))
    log.close()


def test_recovery_truncated_file_drops_later_segments(tmp_path):
    d = tmp_path / "p"
    cfg = LogConfig(segment_bytes=2500)
    log = Log(d, cfg)
    for i in range(30):
        log.append(batch(), leader_epoch=0)
    segs = [(s.base_offset, s.size) for s in log.segments]
    log.close()
    # chop the middle of the second segment (and lose its index): a corrupt
    # middle segment means nothing after it can be trusted
    base, size = segs[1]
    p = d / (segment_name(base) + ".log")
    with open(p, "r+b") as f:
        f.truncate(size - 10)
    (d / (segment_name(base) + ".index")).unlink()
    log = Log(d, cfg)
    assert len(log.segments) == 2
    assert all_offsets(log) == list(range(log.log_end_offset))
    assert log.log_end_offset < segs[2][0]
    log.close()


def test_crc_corruption_in_unflushed_tail(tmp_path):
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    sizes = []
    for i in range(6):
        sizes.append(log.append(batch(), leader_epoch=0).position)
    seg_log, _ = _seg_files(d)
    _crash(log)  # nothing was ever flushed: the whole segment is re-verified
    with open(seg_log, "r+b") as f:
        f.seek(sizes[4] + 70)
        f.write(b"\xff")
    _reboot(d)
    log = Log(d, LogConfig())
    assert log.log_end_offset == 12
    # what survived a reboot was read back from disk: it now counts as flushed
    assert log.active_segment.flushed_length == log.active_segment.size
    log.close()


def test_same_boot_recovery_checks_only_the_tail(tmp_path):
    """After a process crash (same boot) the page cache holds every committed
    byte: recovery re-verifies just the last 64 KiB, not the unflushed MBs."""
    d = tmp_path / "p"
    log = Log(d, LogConfig())
    b = batch(n=1, value=b"q" * 4000)
    for i in range(1000):
        log.append(b, leader_epoch=0)
    end = log.log_end_offset
    _crash(log)
    log = Log(d, LogConfig())
    assert log.log_end_offset == end
    assert 0 < log.active_segment.recovery_verified_bytes <= (64 << 10) + len(b)
    _crash(log)
    _reboot(d)
    log = Log(d, LogConfig())
    assert log.log_end_offset == end
    assert log.active_segment.recovery_verified_bytes == end * len(b)
    log.close()


def test_kill_9_loses_nothing_acknowledged(tmp_path):
    """A real kill -9 of an appending process; every acknowledged batch is kept."""
    import signal
    import subprocess
    import sys
    import time
    d = tmp_path / "p"
    code = f"""
import sys
sys.path.insert(0, {os.getcwd()!r})
from storage import Log, LogConfig
from protocol.records import build_batch
log = Log({str(d)!r}, LogConfig(segment_bytes=64 * 1024))
b = build_batch([(None, b"x" * 300, [], 1)] * 2)
i = 0
while True:
    r = log.append(b, leader_epoch=0)
    i += 1
    if i % 50 == 0:
        sys.stdout.write(f"{{r.last_offset}}\\n"); sys.stdout.flush()
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    acked = -1
    deadline = time.time() + 1.0
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        acked = int(line)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert acked > 100
    log = Log(d, LogConfig(segment_bytes=64 * 1024))
    assert log.log_end_offset > acked
    data = log.read(0, 1 << 40).read_bytes()
    R.validate_batches(data)
    assert offsets_of(data) == list(range(log.log_end_offset))
    log.close()


# -- flush / threads ------------------------------------------------------------

def test_flush_from_thread_while_appending(tmp_path):
    d = tmp_path / "p"
    log = Log(d, LogConfig(segment_bytes=20_000))
    stop = threading.Event()
    covered = []
    errors = []

    def flusher():
        try:
            while not stop.is_set():
                covered.append(log.flush())
        except Exception as e:  # pragma: no cover
            errors.append(e)

    t = threading.Thread(target=flusher)
    t.start()
    for i in range(2000):
        log.append(batch(), leader_epoch=0)
        if i % 300 == 0:
            log.enforce_retention(0)
    stop.set()
    t.join()
    assert not errors
    assert covered == sorted(covered)
    assert log.flush() == log.log_end_offset == log.flushed_offset
    for s in log.segments:
        assert s.flushed_length == s.size
    end = log.log_end_offset
    _crash(log)
    log = Log(d, LogConfig(segment_bytes=20_000))
    assert log.log_end_offset == end
    log.close()


def test_deleted_segment_fd_stays_valid_while_read_pinned(tmp_path):
    log = Log(tmp_path / "p", LogConfig(segment_bytes=1500))
    for i in range(20):
        log.append(batch(), leader_epoch=0)
    rr = log.read(0, 1 << 20)
    want = rr.read_bytes()
    log.delete_records_before(log.log_end_offset - 1)
    assert rr.read_bytes() == want  # unlinked, but the fds are still open
    fds = [fd for fd, _, _ in rr.regions]
    rr.release()
    for fd in fds[:-1]:
        with pytest.raises(OSError):
            os.fstat(fd)
    log.close()


def test_delete_removes_directory(tmp_path):
    log = Log(tmp_path / "p", LogConfig())
    log.append(batch(), leader_epoch=0)
    log.delete()
    assert not (tmp_path / "p").exists()
    log.flush()  # a late flush (broker's flusher) is harmless


def test_config_from_topic_configs():
    c = LogConfig.from_topic_configs({"segment.bytes": "1000", "retention.ms": "-1",
                                      "retention.bytes": "5", "segment.ms": "7",
                                      "max.message.bytes": "9",
                                      "message.timestamp.type": "LogAppendTime",
                                      "compression.type": "producer"})
    assert (c.segment_bytes, c.retention_ms, c.retention_bytes, c.segment_ms,
            c.max_message_bytes) == (1000, -1, 5, 7, 9)
    assert c.log_append_time


def test_data_dir_lock(tmp_path):
    lock = DataDirLock(tmp_path)
    with pytest.raises(DataDirLocked) as e:
        DataDirLock(tmp_path)
    assert str(os.getpid()) in str(e.value) and str(tmp_path) in str(e.value)
    lock.release()
    DataDirLock(tmp_path).release()


# -- property: a random workload matches a model --------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5), st.integers(0, 4), st.integers(0, 2000)),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("crash")),
    st.tuples(st.just("truncate"), st.integers(0, 100)),
    st.tuples(st.just("delete_before"), st.integers(0, 100)),
), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops)
def test_model(tmp_path_factory, ops):
    d = tmp_path_factory.mktemp("m") / "p"
    cfg = LogConfig(segment_bytes=1200)
    log = Log(d, cfg)
    model = []   # list of (offset, timestamp) present
    start = 0
    for op in ops:
        if op[0] == "append":
            _, n, codec, ts = op
            r = log.append(build_batch([(None, b"v" * 60, [], ts + i) for i in range(n)],
                                       codec=codec), leader_epoch=0)
            assert r.base_offset == (model[-1][0] + 1 if model else log.log_end_offset - n)
            model += [(r.base_offset + i, ts + i) for i in range(n)]
        elif op[0] == "reopen":
            log.close(); log = Log(d, cfg)
        elif op[0] == "crash":
            _crash(log); log = Log(d, cfg)
        elif op[0] == "truncate":
            target = op[1]
            if target < log.log_end_offset and target >= log.log_start_offset:
                log.truncate_to(target)
                model = [m for m in model if m[0] < log.log_end_offset]
        elif op[0] == "delete_before":
            target = min(op[1], log.log_end_offset)
            start = log.delete_records_before(target)
        visible = [m for m in model if m[0] >= log.log_start_offset]
        got = offsets_of(log.read(log.log_start_offset, 1 << 30).read_bytes())
        assert [o for o in got if o >= log.log_start_offset] == [m[0] for m in visible]
        for ts in (0, 500, 1999, 3000):
            want = next(((o, t) for o, t in visible if t >= ts), None)
            assert log.offset_for_timestamp(ts) == want
    log.close()


def test_batches_of_every_size_round_trip_with_patched_headers(tmp_path):
    """One pwritev per batch: the patched header (baseOffset, partitionLeaderEpoch)
    and the rest of the caller's buffer, which is left as it was (it may be the
    receive buffer of a request still being answered)."""
    d = tmp_path / "p"
    cfg = LogConfig(segment_bytes=1 << 20, max_message_bytes=1 << 22)
    log = Log(d, cfg)
    big = batch(n=2, value=os.urandom(128 << 10))
    small = batch(n=1)
    kept = (bytes(big), bytes(small))
    for i in range(12):
        log.append(memoryview(big) if i % 3 else small, leader_epoch=4)
    assert (bytes(big), bytes(small)) == kept
    data = log.read(0, 1 << 30).read_bytes()
    hs = R.validate_batches(data, strict=True)
    assert [h.partition_leader_epoch for h in hs] == [4] * 12
    assert offsets_of(data) == list(range(log.log_end_offset))
    end = log.log_end_offset
    _crash(log)
    log = Log(d, cfg)
    assert log.log_end_offset == end and log.read(0, 1 << 30).read_bytes() == data
    log.close()


def test_flush_racing_a_truncation_never_raises_the_flushed_length(tmp_path, monkeypatch):
    """Issue 10, defect 10: a flush in its worker thread fsyncs while the owning thread
    truncates (a follower cutting a divergent tail). The flush must not then record the
    pre-truncation length as flushed: recovery trusts bytes below flushed_length unchecked,
    and those bytes are about to be rewritten by new appends."""
    log = Log(tmp_path / "p", LogConfig())
    for _ in range(10):
        log.append(batch(), leader_epoch=0)
    seg = log._segments[-1]
    in_fsync, release = threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd):
        if threading.current_thread().name == "flusher" and fd == seg.log_fd:
            in_fsync.set()
            release.wait(10)
        return real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    flusher = threading.Thread(target=log.flush, name="flusher")
    flusher.start()
    assert in_fsync.wait(10)
    log.truncate_to(15)                 # meanwhile, on the owning thread
    release.set()
    flusher.join(10)
    assert seg.flushed_length <= seg.size, (seg.flushed_length, seg.size)
    assert log.flushed_offset <= log.log_end_offset == 15
    log.close()
    reopened = Log(tmp_path / "p", LogConfig())
    assert reopened.log_end_offset == 15 and all_offsets(reopened) == list(range(15))
    reopened.close()
