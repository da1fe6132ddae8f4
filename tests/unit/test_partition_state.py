"""A new topic's partitions are made at their first use, not by CreateTopics
(broker/topics.py, Partitions), and a partition makes its on-use state (producer state,
epoch cache, waiters, the leader's follower state) when first used: CreateTopics of
1 000 partitions otherwise builds them all before it answers. Each partition still has
its own."""
from __future__ import annotations

import trio

from broker import config as broker_config
from broker.handlers.metadata import topic_metadata
from broker.topics import _FILE_MAKER, TopicRegistry
from protocol.records import build_batch

ON_USE = ("producers", "epochs", "waiters", "_hw_waiters", "leader_state", "hw_sent",
          "downstream_fetches", "_pending_snapshots")


def _registry(tmp_path) -> TopicRegistry:
    cfg = broker_config.load_config({"data_dir": str(tmp_path), "listen": "127.0.0.1:0", "node_id": 0})
    return TopicRegistry(cfg.data_dir, cfg)


def test_a_new_topics_partitions_make_their_on_use_state_only_when_used(tmp_path):
    reg = _registry(tmp_path)
    p0, p1 = reg.create("t", 2).partitions
    assert not set(ON_USE) & set(vars(p0)), "made at create"
    r = p0.log.append(build_batch([(None, b"v", [], None)]), leader_epoch=p0.leader_epoch)
    p0.on_leader_append(r.base_offset)
    assert p0.high_watermark == 1
    assert not set(ON_USE) & set(vars(p1)), "p1 untouched"
    reg.close()


def test_each_partition_has_its_own_state(tmp_path):
    reg = _registry(tmp_path)
    p0, p1 = reg.create("t", 2).partitions
    p0.waiters.add(trio.Event())
    p0.producers.record(7, 0, 0, 0, 0, 0)
    p0.epochs.note(3, 0)
    p0.hw_sent[1] = 5
    p0.downstream_fetches[1] = (5, 0)
    p0.bytes_in += 10
    p0.set_assignment([0, 1], 1, 4, isr=[0, 1])
    assert (p1.waiters, p1.producers.entries, p1.epochs.entries, p1.hw_sent, p1.downstream_fetches) \
        == (set(), {}, [], {}, {})
    assert (p1.bytes_in, p1.leader_epoch, p1.replicas, p1.isr()) == (0, 0, [0], [0])
    assert p1.leader_state.children == [] and p0.leader_state.children == [1]
    reg.close()


def test_a_reopened_partition_has_its_producer_state(tmp_path):
    reg = _registry(tmp_path)
    p = reg.create("t", 1).partitions[0]
    batch = build_batch([(None, b"v", [], None)], producer_id=9, producer_epoch=0, base_sequence=0)
    r = p.log.append(batch, leader_epoch=0)
    p.producers.record(9, 0, 0, 0, r.base_offset, 0)
    reg.close()
    again = _registry(tmp_path)
    again.load()
    assert 9 in again.partition("t", 0).producers.entries
    again.close()


def test_create_makes_no_partition_until_one_is_used(tmp_path):
    reg = _registry(tmp_path)
    parts = reg.create("t", 1000).partitions
    assert len(parts) == 1000 and parts.made() == []
    assert parts[999].index == 999 and parts[-1] is parts[999] and parts.made() == [parts[999]]
    assert [p.index for p in parts[10:13]] == [10, 11, 12] and len(parts.made()) == 4
    assert parts.leader_epochs() == [0] * 1000 and len(parts.made()) == 4
    reg.close()


def test_metadata_answers_for_partitions_not_made(tmp_path):
    reg = _registry(tmp_path)
    parts = reg.create("t", 300).partitions

    class Broker:
        node_id = 0
    encoded = topic_metadata(Broker(), reg.topics["t"], 12)["partitions"]
    assert parts.made() == []
    parts[5].leader_epoch = 3   # a moved epoch is answered from the partition made
    again = topic_metadata(Broker(), reg.topics["t"], 12)["partitions"]
    assert again != encoded and len(parts.made()) == 300
    reg.close()


def test_file_maker_makes_files_of_partitions_not_made_and_they_open_empty(tmp_path):
    reg = _registry(tmp_path)
    parts = reg.create("t", 50).partitions
    _FILE_MAKER.submit(lambda: None).result()   # runs after the create's job
    d = tmp_path / "topics" / "t"
    assert all(sorted(f.name for f in (d / str(i)).iterdir()) == ["00000000000000000000.index",
                                                                  "00000000000000000000.log"]
               for i in range(50))
    assert parts.made() == []
    p = parts[7]
    r = p.log.append(build_batch([(None, b"v", [], None)]), leader_epoch=0)
    assert (r.base_offset, p.log.log_end_offset) == (0, 1)
    reg.close()
    again = _registry(tmp_path)
    again.load()
    assert again.partition("t", 7).log.log_end_offset == 1
    assert again.partition("t", 8).log.log_end_offset == 0
    again.close()


def test_deleting_a_topic_makes_none_of_its_partitions(tmp_path):
    reg = _registry(tmp_path)
    topic = reg.create("t", 200)
    topic.partitions[3].log.append(build_batch([(None, b"v", [], None)]), leader_epoch=0)
    reg.delete("t")
    assert len(topic.partitions.made()) == 1 and topic.deleted
    _FILE_MAKER.submit(lambda: None).result()
    assert not (tmp_path / "topics" / "t").exists()
    reg.close()
