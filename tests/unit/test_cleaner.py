"""The log cleaner (storage/cleaner.py) on real files, with the clock passed in."""
from __future__ import annotations

import os

import pytest

from protocol.records import DELETE_HORIZON_MASK, CODEC_GZIP, CODEC_NONE, CODEC_ZSTD, build_batch, iter_records
from storage import Log, LogConfig
from storage import cleaner
from storage.cleaner import Throttler, clean_log

T0 = 1_700_000_000_000
DAY = 24 * 3600 * 1000


def cfg(**kw) -> LogConfig:
    base = dict(cleanup_policy="compact", segment_bytes=4096, min_cleanable_dirty_ratio=0.0,
                delete_retention_ms=DAY)
    base.update(kw)
    return LogConfig(**base)


def put(lg: Log, records, *, ts=T0, codec=CODEC_NONE, pid=-1, epoch=-1, seq=-1):
    """records: [(key, value)]; all in one batch."""
    b = build_batch([(k, v, [], ts) for k, v in records], codec=codec, producer_id=pid,
                    producer_epoch=epoch, base_sequence=seq)
    return lg.append(b, leader_epoch=0, now_ms=ts)


def read_all(lg: Log):
    """[(offset, key, value, timestamp)] of a full read from the log start."""
    out = []
    for seg in lg.segments:
        for i in range(seg.entries):
            _, _, _, pos, size = seg.entry(i)
            out += [(r.offset, r.key, r.value, r.timestamp) for r in iter_records(seg.read_at(pos, size))]
    return out


def latest(records):
    m = {}
    for off, k, v, ts in records:
        m[k] = (off, v)
    return m


def write_updates(lg, n=600, keys=20, codec=CODEC_NONE, per_batch=3, ts=T0):
    written = []
    i = 0
    while i < n:
        batch = []
        for _ in range(per_batch):
            k = f"k{i % keys}".encode()
            batch.append((k, f"v{i}".encode() * 5))
            i += 1
        r = put(lg, batch, codec=codec, ts=ts + i)
        written += [(r.base_offset + j, k, v, ts + i) for j, (k, v) in enumerate(batch)]
    return written


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP, CODEC_ZSTD])
def test_keeps_latest_per_key_with_original_offsets(tmp_path, codec):
    lg = Log(tmp_path, cfg())
    written = write_updates(lg, codec=codec)
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 10_000)     # the active segment: never cleaned
    before_segments = len(lg.segments)
    p = clean_log(lg, T0 + 20_000)
    assert p is not None and p.dirty_ratio > 0
    after = read_all(lg)
    want = latest(written)
    # sealed part: exactly the latest value per key, at its original offset, in order
    sealed = [r for r in after if r[1] != b"tail"]
    assert [(o, k, v) for o, k, v, _ in sealed] == sorted((o, k, v) for k, (o, v) in want.items())
    assert [r[1] for r in after if r[1] == b"tail"] == [b"tail"]
    assert len(lg.segments) < before_segments
    assert lg.log_end_offset == written[-1][0] + 2
    # reopen: recovery accepts the gaps, nothing lost
    lg.close()
    lg2 = Log(tmp_path, cfg())
    assert read_all(lg2) == after
    assert lg2.log_end_offset == written[-1][0] + 2
    lg2.close()


def test_reads_and_timestamp_lookups_across_gaps(tmp_path):
    lg = Log(tmp_path, cfg())
    written = write_updates(lg, n=300, keys=10)
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 10_000)
    clean_log(lg, T0 + 20_000)
    kept = read_all(lg)
    offsets = [r[0] for r in kept]
    # a Fetch from any offset, gap or not, starts at the first kept record at or after it
    for o in range(0, lg.log_end_offset):
        with lg.read(o, 1 << 20) as rr:
            got = [x for x in _all_offsets(rr) if x >= o] if rr else []
        assert got and got[0] == next(x for x in offsets if x >= o)
    # a timestamp lookup finds the first kept record at or after the timestamp
    for _, _, _, ts in written[::17]:
        want = next((r[0], r[3]) for r in kept if r[3] >= ts)
        assert lg.offset_for_timestamp(ts) == want
    lg.close()


def _all_offsets(rr):
    data = rr.read_bytes()
    out = []
    pos = 0
    from protocol.records import BatchHeader
    while pos < len(data):
        h = BatchHeader.parse(data, pos)
        out += [r.offset for r in iter_records(data, pos)]
        pos += h.total_size
    return out


def test_tombstones_kept_for_delete_retention_then_dropped(tmp_path):
    lg = Log(tmp_path, cfg(delete_retention_ms=60_000))
    put(lg, [(b"a", b"1"), (b"b", b"1")], ts=T0)
    put(lg, [(b"a", None)], ts=T0 + 1)
    lg.roll(T0)
    put(lg, [(b"c", b"1")], ts=T0 + 2)
    before = read_all(lg)
    clean_log(lg, T0 + 1000)
    # the first cleaning keeps the tombstone and stamps its batch with the delete horizon
    # (KIP-534) without changing any record's timestamp
    assert read_all(lg) == [before[1], before[2], before[3]]
    h = [h for h in lg.iter_batch_headers() if h.base_offset == 2][0]
    assert h.attributes & DELETE_HORIZON_MASK and h.base_timestamp == T0 + 1000 + 60_000
    # nothing new is dirty and the horizon is ahead: nothing to do; then the cleaner runs for it
    assert cleaner.plan(lg, T0 + 60_999) is None
    p = clean_log(lg, T0 + 61_000)
    assert p is not None and "tombstone" in p.reason
    assert [(k, v) for _, k, v, _ in read_all(lg)] == [(b"b", b"1"), (b"c", b"1")]
    lg.close()


def test_dirty_ratio_and_compaction_lags(tmp_path):
    lg = Log(tmp_path, cfg(min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=5000,
                           max_compaction_lag_ms=10 * 60_000))
    write_updates(lg, n=300, keys=10)
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 1)
    # every sealed record is younger than min.compaction.lag.ms: nothing cleanable
    assert cleaner.plan(lg, T0 + 1000) is None
    p = clean_log(lg, T0 + 10_000)
    assert p is not None and p.reason.startswith("dirty ratio")
    # right after a cleaning the dirty ratio is 0
    assert cleaner.plan(lg, T0 + 10_000) is None
    # a little new dirty data: ratio below 0.5, not cleaned until max.compaction.lag.ms
    put(lg, [(b"k1", b"new")], ts=T0 + 20_000)
    lg.roll(T0)
    put(lg, [(b"tail2", b"x")], ts=T0 + 20_000)
    assert cleaner.plan(lg, T0 + 30_000) is None
    p = cleaner.plan(lg, T0 + 20_000 + 10 * 60_000 + 1)
    assert p is not None and p.reason == "max.compaction.lag.ms"
    p.release()
    lg.close()


def test_max_compaction_lag_rolls_the_active_segment():
    c = cfg(segment_ms=7 * DAY, max_compaction_lag_ms=60_000)
    assert c.roll_ms == 60_000
    assert LogConfig(cleanup_policy="delete", max_compaction_lag_ms=60_000).roll_ms == 7 * 24 * 3600 * 1000


def test_compact_only_topic_ignores_retention(tmp_path):
    lg = Log(tmp_path, cfg(retention_ms=1, retention_bytes=1))
    write_updates(lg, n=100, keys=5)
    lg.roll(T0)
    assert lg.enforce_retention(T0 + DAY) == 0
    lg.close()
    lg = Log(tmp_path, cfg(cleanup_policy="compact,delete", retention_ms=1))
    put(lg, [(b"x", b"y")], ts=T0 + DAY)
    assert lg.enforce_retention(T0 + DAY) > 0
    lg.close()


def test_idempotent_producer_last_batch_kept_empty(tmp_path):
    lg = Log(tmp_path, cfg())
    put(lg, [(b"a", b"1")], pid=7, epoch=0, seq=0)
    put(lg, [(b"a", b"2")], pid=7, epoch=0, seq=1)      # producer 7's last batch
    put(lg, [(b"a", b"3")], pid=8, epoch=0, seq=0)      # supersedes it
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 5)
    clean_log(lg, T0 + 1000)
    headers = list(lg.iter_batch_headers())
    by_pid = [(h.producer_id, h.base_sequence, h.records_count, h.base_offset) for h in headers]
    # producer 7's first batch is gone, its last stays (empty) with its sequence and offset
    assert (7, 0, 1, 0) not in by_pid
    assert (7, 1, 0, 1) in by_pid
    assert (8, 0, 1, 2) in by_pid
    assert [(o, k, v) for o, k, v, _ in read_all(lg)] == [(2, b"a", b"3"), (3, b"tail", b"x")]
    lg.close()


def test_follower_append_across_gaps_survives_restart(tmp_path):
    leader = Log(tmp_path / "leader", cfg())
    write_updates(leader, n=200, keys=5)
    leader.roll(T0)
    put(leader, [(b"tail", b"x")], ts=T0 + 5)
    clean_log(leader, T0 + 1000)
    follower = Log(tmp_path / "follower", cfg())
    offset = 0
    while offset < leader.log_end_offset:
        with leader.read(offset, 1000) as rr:
            data = rr.read_bytes()
        r = follower.append_replicated(data)
        offset = r.last_offset + 1
    assert read_all(follower) == read_all(leader)
    follower.close()
    follower = Log(tmp_path / "follower", cfg())
    assert read_all(follower) == read_all(leader)
    assert follower.log_end_offset == leader.log_end_offset
    follower.close()
    leader.close()


def _prepare(tmp_path):
    lg = Log(tmp_path, cfg())
    written = write_updates(lg, n=400, keys=10)
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 5)
    return lg, written


@pytest.mark.parametrize("stop_at", ["cleaned", "index_swap", "log_swap", "others_unlinked", "index_renamed"])
def test_crash_at_each_step_of_a_swap(tmp_path, stop_at):
    """Leave the directory as a kill -9 at each point of the swap would, then reopen."""
    lg, written = _prepare(tmp_path)
    before = read_all(lg)
    p = cleaner.plan(lg, T0 + 1000)
    cleaner.build_offset_map(p)
    cg = cleaner.clean_group(p, 0)
    g = cg.old
    assert len(g) > 1
    ix, lgp = str(cg.index_path), str(cg.log_path)
    if stop_at != "cleaned":
        os.rename(ix + ".cleaned", ix + ".swap")
    if stop_at in ("log_swap", "others_unlinked", "index_renamed"):
        os.rename(lgp + ".cleaned", lgp + ".swap")
    if stop_at in ("others_unlinked", "index_renamed"):
        for s in g[1:]:
            s.index_path.unlink()
            s.log_path.unlink()
    if stop_at == "index_renamed":
        os.rename(ix + ".swap", ix)
    p.release()
    lg.close(flush=False)
    lg2 = Log(tmp_path, cfg())
    after = read_all(lg2)
    if stop_at in ("cleaned", "index_swap"):
        assert after == before          # not committed: the old segments
    else:
        # committed: the new segment; every key's latest value is still there
        assert latest(after) == latest(before)
        assert len(after) < len(before)
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".cleaned", ".swap"))]
    assert lg2.log_end_offset == lg.log_end_offset
    lg2.close()


def test_reader_holding_old_segment_survives_swap(tmp_path):
    lg, written = _prepare(tmp_path)
    rr = lg.read(0, 1 << 30)
    old = rr.read_bytes()
    clean_log(lg, T0 + 1000)
    assert rr.read_bytes() == old   # the pinned, unlinked files still read
    rr.release()
    assert len(read_all(lg)) < len(written)
    lg.close()


def test_cleaning_is_repeatable_and_merges_segments(tmp_path):
    lg, written = _prepare(tmp_path)
    clean_log(lg, T0 + 1000)
    n1 = len(lg.segments)
    first = read_all(lg)
    # more updates, cleaned again: the cleaned segments are merged with the new ones
    more = write_updates(lg, n=400, keys=10, ts=T0 + 100)
    lg.roll(T0)
    put(lg, [(b"tail2", b"y")], ts=T0 + 900)
    clean_log(lg, T0 + 2000)
    after = read_all(lg)
    sealed_latest = {k: v for k, (o, v) in latest(first + more).items()}
    got = {k: v for k, (o, v) in latest(after).items()}
    for k, v in sealed_latest.items():
        assert got[k] == v
    assert len(lg.segments) <= n1 + 2
    lg.close()


def test_offset_map_limit_cleans_in_rounds(tmp_path):
    lg = Log(tmp_path, cfg())
    written = write_updates(lg, n=600, keys=300)
    lg.roll(T0)
    put(lg, [(b"tail", b"x")], ts=T0 + 5)
    p = clean_log(lg, T0 + 1000, max_map_entries=50)
    assert p.end_offset < lg.segments[-1].base_offset   # stopped early
    while cleaner.plan(lg, T0 + 1000) is not None:
        clean_log(lg, T0 + 1000, max_map_entries=50)
    want = latest(written)
    got = latest([r for r in read_all(lg) if r[1] != b"tail"])
    assert got == want
    lg.close()


def test_throttler_sleeps_to_the_rate():
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    t = Throttler(1000, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        t.charge(500)
    assert now[0] == pytest.approx(5.0)
    assert Throttler(float("inf")).charge(1 << 30) is None


def test_truncation_makes_the_log_dirty_again(tmp_path):
    lg, written = _prepare(tmp_path)
    clean_log(lg, T0 + 1000)
    assert cleaner.read_checkpoint(tmp_path)[0] == lg.segments[-1].base_offset
    lg.truncate_to(100)                       # a follower's divergent tail goes
    assert cleaner.read_checkpoint(tmp_path)[0] == 0
    assert lg.log_end_offset <= 100
    lg.close()
