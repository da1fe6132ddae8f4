"""Producer-state snapshots: the codec, and a partition's state restored from the newest
valid snapshot plus the batch headers after it, equal to a replay of the whole log."""
from __future__ import annotations

import uuid

import pytest
import trio

from broker.producer_state import (
    ProducerStateTable, SnapshotError, decode_snapshot, encode_snapshot, list_snapshots,
    snapshot_path,
)
from broker.topics import Partition, Topic
from protocol.records import build_batch
from replication.replica_state import EpochCache
from storage import Log, LogConfig


def _table() -> ProducerStateTable:
    t = ProducerStateTable()
    for i in range(7):   # more than five batches: only the last five are kept
        t.record(1000, 3, i * 10, 9, i * 10, 1_700_000_000_000 + i)
    t.record(2000, 0, 2**31 - 2, 4, 70, 5)   # wraps the sequence
    return t


def _dump(t: ProducerStateTable):
    return {pid: (e.epoch, [tuple((b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.timestamp))
                            for b in e.batches]) for pid, e in t.entries.items()}


def test_codec_round_trip():
    t = _table()
    data = encode_snapshot(75, t, [(0, 0), (2, 40)])
    off, t2, epochs = decode_snapshot(data)
    assert off == 75 and epochs == [(0, 0), (2, 40)]
    assert _dump(t2) == _dump(t)
    assert len(t2.entries[1000].batches) == 5
    # the restored table judges a retry like the original: duplicate with original offsets
    assert t2.check(1000, 3, 60, 9).duplicate.base_offset == 60
    assert t2.check(1000, 3, 71, 0).error != 0


def test_codec_empty():
    off, t, epochs = decode_snapshot(encode_snapshot(0, ProducerStateTable(), []))
    assert (off, t.entries, epochs) == (0, {}, [])


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "extend"])
def test_codec_rejects_damage(damage):
    data = bytearray(encode_snapshot(75, _table(), [(0, 0)]))
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[20] ^= 0x40
    elif damage == "empty":
        data = b""
    else:
        data += b"\0"
    with pytest.raises(SnapshotError):
        decode_snapshot(bytes(data))


# -- a partition over a real log --------------------------------------------------------

def _partition(tmp_path, segment_bytes=4000) -> Partition:
    d = tmp_path / "t"
    d.mkdir(parents=True, exist_ok=True)
    topic = Topic("t", uuid.uuid4(), {}, d)
    p = Partition(topic, 0, Log(d / "0", LogConfig(segment_bytes=segment_bytes)))
    topic.partitions.append(p)
    return p


def _produce(p: Partition, pid: int, seq: int, n: int = 3):
    """What the Produce handler does for an idempotent batch: check, append, record."""
    batch = build_batch([(None, b"x" * 300, [], None)] * n, producer_id=pid, producer_epoch=0,
                        base_sequence=seq)
    check = p.producers.check(pid, 0, seq, n - 1)
    if check.duplicate is not None:
        return check.duplicate.base_offset, True
    assert not check.error
    r = p.log.append(batch, leader_epoch=p.leader_epoch)
    p.producers.record(pid, 0, seq, n - 1, r.base_offset, r.max_timestamp)
    p.on_leader_append(r.base_offset)
    return r.base_offset, False


def _state(p: Partition):
    return _dump(p.producers), list(p.epochs.entries)


def _full_replay(p: Partition):
    t, e = ProducerStateTable(), EpochCache()
    Partition._replay(p.log.iter_batch_headers(), t, e)
    return _dump(t), list(e.entries)


def _fill(p: Partition, batches: int = 20):
    seqs = {1: 0, 2: 0}
    for i in range(batches):
        pid = 1 + i % 2
        _produce(p, pid, seqs[pid])
        seqs[pid] += 3
        if i == 10:
            p.set_assignment([p.node_id], 1, 1)   # a new leader epoch mid-log
    p._wait_snapshot_written()   # written by the snapshot writer thread
    return seqs


def test_roll_writes_snapshots_and_restart_replays_only_the_tail(tmp_path):
    p = _partition(tmp_path)
    _fill(p)
    snaps = list_snapshots(p.log.directory)
    bases = [s.base_offset for s in p.log.segments]
    assert len(bases) > 3 and snaps == bases[1:]   # one per roll, named by the new segment
    expected = _state(p)
    assert expected == _full_replay(p)
    p.log.close()   # a crash after the data reached the page cache: no shutdown snapshot
    q = _partition(tmp_path)
    assert _state(q) == expected
    # a retried batch is answered with its original offset after the restart
    first_of_pid1 = q.producers.entries[1].batches[-1]
    assert _produce(q, 1, first_of_pid1.first_seq) == (first_of_pid1.base_offset, True)
    q.close()
    assert list_snapshots(q.log.directory)[-1] == q.log.log_end_offset   # clean shutdown
    r = _partition(tmp_path)
    assert _state(r) == expected
    at_end = snapshot_path(r.log.directory, r.log.log_end_offset)
    before = at_end.stat().st_mtime_ns, at_end.stat().st_ino
    r.close()   # nothing appended since the last clean shutdown: its snapshot stays
    assert (at_end.stat().st_mtime_ns, at_end.stat().st_ino) == before


def test_empty_log_writes_no_snapshot(tmp_path):
    p = _partition(tmp_path)
    p.close()
    assert list_snapshots(p.log.directory) == []


def test_damaged_newest_snapshot_falls_back_to_older(tmp_path, caplog):
    p = _partition(tmp_path)
    _fill(p)
    expected = _state(p)
    p.log.close()
    snaps = list_snapshots(p.log.directory)
    newest = snapshot_path(p.log.directory, snaps[-1])
    newest.write_bytes(newest.read_bytes()[:-3])          # torn
    (p.log.directory / (newest.name + ".tmp")).write_bytes(b"half")   # interrupted write
    q = _partition(tmp_path)
    assert _state(q) == expected
    assert "damaged" in caplog.text
    assert list_snapshots(q.log.directory) == snaps[:-1]   # the damaged one is gone
    assert not list(q.log.directory.glob("*.tmp"))
    q.log.close()


def test_snapshot_beyond_log_end_is_dropped(tmp_path):
    p = _partition(tmp_path)
    _fill(p)
    expected = _state(p)
    end = p.log.log_end_offset
    p.log.close()
    # e.g. a machine crash that lost log data a durable snapshot had already seen
    snapshot_path(p.log.directory, end + 100).write_bytes(
        encode_snapshot(end + 100, ProducerStateTable(), []))
    q = _partition(tmp_path)
    assert _state(q) == expected
    assert max(list_snapshots(q.log.directory)) < end + 100
    q.log.close()


def test_truncation_below_snapshots_rebuilds_from_older_one(tmp_path):
    p = _partition(tmp_path)
    _fill(p)
    snaps = list_snapshots(p.log.directory)
    cut = snaps[1] + 1
    trio.run(p.truncate_to, cut)
    assert p.log.log_end_offset <= cut
    assert list_snapshots(p.log.directory) == [s for s in snaps if s <= p.log.log_end_offset]
    assert _state(p) == _full_replay(p)
    # and no snapshot at all below the cut: a whole replay (in a worker thread)
    for s in list_snapshots(p.log.directory):
        snapshot_path(p.log.directory, s).unlink()
    trio.run(p.truncate_to, p.log.log_end_offset - 5)
    assert _state(p) == _full_replay(p)
    p.log.close()


def test_replicated_appends_snapshot_at_their_rolls(tmp_path):
    leader = _partition(tmp_path / "a")
    _fill(leader)
    follower = _partition(tmp_path / "b")
    follower.set_assignment([7, follower.node_id], 1, 1)
    data = leader.log.read(0, 1 << 30).read_bytes()
    follower.append_replicated(data)   # one append, several rolls inside it
    follower._wait_snapshot_written()
    assert _state(follower) == _state(leader)
    for s in list_snapshots(follower.log.directory):
        _, t, e = decode_snapshot(snapshot_path(follower.log.directory, s).read_bytes())
        want_t, want_e = ProducerStateTable(), EpochCache()
        Partition._replay((h for h in follower.log.iter_batch_headers() if h.base_offset < s), want_t, want_e)
        assert (_dump(t), list(map(tuple, e))) == (_dump(want_t), want_e.entries)
    leader.log.close()
    follower.log.close()
