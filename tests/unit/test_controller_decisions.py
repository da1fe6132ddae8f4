"""The cluster image built from etcd keys (controller/image.py) and the controller's
decisions on it (controller/decisions.py): keys and values in, image and new partition
states out, no etcd."""
import json
import uuid

from hypothesis import given, strategies as st

from controller.decisions import changes_for_liveness, reassign
from controller.image import (CONTROLLER_KEY, PRODUCER_ID_BLOCK_KEY, ClusterImage, PartitionImage, TopicImage,
                              broker_key, broker_registration, encode, partition_key, topic_key)
from replication.tree import children_of

TOPIC_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")
OTHER_ID = uuid.UUID("00000000-0000-4000-8000-000000000002")


def topic_value(partitions: int, topic_id=TOPIC_ID, fanout=2, configs=None) -> bytes:
    return TopicImage("t", topic_id, configs or {}, fanout, partitions).to_value()


def partition_value(replicas, isr=None, epoch=0, controller_epoch=7) -> bytes:
    return PartitionImage(list(replicas), epoch, list(isr if isr is not None else replicas)).to_value(controller_epoch)


def image_with(topics: dict[str, list[tuple[list[int], list[int], int]]], brokers=(1, 2, 3, 4)) -> ClusterImage:
    """An image holding ``topics``: name -> [(replicas, isr, leader epoch) per partition]."""
    img = ClusterImage()
    rev = 10
    for b in brokers:
        rev += 1
        img.apply(broker_key(b), encode({"host": "127.0.0.1", "port": 9000 + b, "rack": None}), rev, rev)
    for name, parts in topics.items():
        rev += 1
        img.apply(topic_key(name), TopicImage(name, uuid.uuid4(), {}, 2, len(parts)).to_value(), rev, rev)
        for i, (replicas, isr, epoch) in enumerate(parts):
            rev += 1
            img.apply(partition_key(name, i), partition_value(replicas, isr, epoch), rev, rev)
    return img


# -- ClusterImage.apply ----------------------------------------------------------------------

def test_controller_key_create_revision_is_the_controller_epoch():
    img = ClusterImage()
    assert (img.controller_id, img.controller_epoch) == (-1, -1)
    assert img.apply(CONTROLLER_KEY, encode({"node_id": 3}), mod_revision=40, create_revision=40) == ""
    assert (img.controller_id, img.controller_epoch) == (3, 40)
    # A later put on the same key (same holder, same lease) keeps the create revision.
    img.apply(CONTROLLER_KEY, encode({"node_id": 3}), mod_revision=55, create_revision=40)
    assert img.controller_epoch == 40
    assert img.apply(CONTROLLER_KEY, None, mod_revision=60) == ""   # its lease expired
    assert (img.controller_id, img.controller_epoch) == (-1, -1)
    img.apply(CONTROLLER_KEY, encode({"node_id": 1}), mod_revision=61, create_revision=61)
    assert (img.controller_id, img.controller_epoch) == (1, 61)


def test_broker_registration_put_and_delete():
    img = ClusterImage()
    assert img.apply(broker_key(2), encode({"host": "127.0.0.2", "port": 9092, "rack": "r1"}), 5, 5) == ""
    img.apply(broker_key(1), encode({"host": "127.0.0.1", "port": 9093}), 6, 6)
    assert img.brokers[2].host == "127.0.0.2" and img.brokers[2].port == 9092 and img.brokers[2].rack == "r1"
    assert img.brokers[1].rack is None
    assert img.apply(broker_key(2), None, 7) == ""
    assert set(img.brokers) == {1}
    img.apply(broker_key(2), None, 8)                     # deleting twice is harmless
    assert set(img.brokers) == {1}


def test_broker_registration_with_listeners():
    """KIP-103: host/port are the inter-broker listener's; every listener is registered.
    A value written before listeners existed is one listener, whatever its name."""
    img = ClusterImage()
    value = broker_registration("canopy-1", 9092, "r1", {"INTERNAL": ("canopy-1", 9092),
                                                         "EXTERNAL": ("localhost", 19091)})
    img.apply(broker_key(1), encode(value), 5, 5)
    b = img.brokers[1]
    assert (b.host, b.port, b.rack) == ("canopy-1", 9092, "r1")
    assert b.address(None) == ("canopy-1", 9092)
    assert b.address("EXTERNAL") == ("localhost", 19091)
    assert b.address("CLIENT") is None                      # no such listener: not listed there
    img.apply(broker_key(2), encode({"host": "127.0.0.2", "port": 9092, "rack": None}), 6, 6)
    assert img.brokers[2].address("EXTERNAL") == img.brokers[2].address(None) == ("127.0.0.2", 9092)


def test_topic_is_complete_only_when_every_partition_key_is_present():
    img = ClusterImage()
    assert img.apply(topic_key("t"), topic_value(3, configs={"retention.ms": 5}), 10, 10) == "t"
    assert img.apply(partition_key("t", 0), partition_value([1, 2]), 10, 10) == "t"
    img.apply(partition_key("t", 2), partition_value([3, 1]), 10, 10)
    assert "t" not in img.topics
    assert img.partition("t", 2).replicas == [3, 1]
    img.apply(partition_key("t", 1), partition_value([2, 3], [2], epoch=4), 10, 10)
    t = img.topics["t"]
    assert (t.topic_id, t.fanout, t.num_partitions, t.configs) == (TOPIC_ID, 2, 3, {"retention.ms": "5"})
    assert [p.leader for p in t.partitions] == [1, 2, 3]
    p1 = t.partitions[1]
    assert (p1.replicas, p1.isr, p1.leader_epoch, p1.mod_revision) == ([2, 3], [2], 4, 10)


def test_partition_keys_before_their_topic_key():
    # A range read returns keys in byte order, and /canopy/partitions/ sorts before
    # /canopy/topics/: the partitions of a topic arrive first when a broker loads the image.
    img = ClusterImage()
    img.apply(partition_key("t", 0), partition_value([1]), 3, 3)
    img.apply(partition_key("t", 1), partition_value([2]), 3, 3)
    assert img.topics == {}
    img.apply(topic_key("t"), topic_value(2), 3, 3)
    assert [p.leader for p in img.topics["t"].partitions] == [1, 2]


def test_partition_update_carries_its_mod_revision_for_compare_and_swap():
    img = image_with({"t": [([1, 2, 3], [1, 2, 3], 0)]})
    img.apply(partition_key("t", 0), partition_value([1, 2, 3], [1, 2], 0), mod_revision=99, create_revision=14)
    p = img.topics["t"].partitions[0]
    assert p.isr == [1, 2] and p.mod_revision == 99


def test_deleting_a_partition_key_makes_the_topic_incomplete():
    img = image_with({"t": [([1], [1], 0), ([2], [2], 0)]})
    assert img.apply(partition_key("t", 1), None, 50) == "t"
    assert "t" not in img.topics and img.partition("t", 0) is not None


def test_deleting_a_topic_drops_it_and_its_partitions():
    img = image_with({"t": [([1], [1], 0), ([2], [2], 0)], "u": [([3], [3], 0)]})
    assert img.apply(topic_key("t"), None, 50) == "t"
    assert set(img.topics) == {"u"}
    assert img.partition("t", 0) is None
    # The transaction that deleted the topic deletes its partition keys too.
    img.apply(partition_key("t", 0), None, 50)
    img.apply(partition_key("t", 1), None, 50)
    assert set(img.topics) == {"u"} and img.partition("t", 0) is None


def test_recreated_topic_with_a_new_id_drops_the_old_partitions():
    img = ClusterImage()
    img.apply(topic_key("t"), topic_value(2, TOPIC_ID), 10, 10)
    img.apply(partition_key("t", 0), partition_value([1, 2], epoch=5), 10, 10)
    img.apply(partition_key("t", 1), partition_value([2, 1], epoch=5), 10, 10)
    assert img.topics["t"].topic_id == TOPIC_ID
    # A broker that missed the deletion sees the topic key again with another id.
    img.apply(topic_key("t"), topic_value(2, OTHER_ID), 20, 20)
    assert "t" not in img.topics and img.partition("t", 0) is None
    img.apply(partition_key("t", 0), partition_value([3, 1]), 20, 20)
    img.apply(partition_key("t", 1), partition_value([1, 3]), 20, 20)
    t = img.topics["t"]
    assert t.topic_id == OTHER_ID and [p.replicas for p in t.partitions] == [[3, 1], [1, 3]]
    assert [p.leader_epoch for p in t.partitions] == [0, 0]


def test_growing_a_topic_keeps_its_partitions():
    img = ClusterImage()
    img.apply(topic_key("t"), topic_value(1), 10, 10)
    img.apply(partition_key("t", 0), partition_value([1, 2], epoch=3), 10, 10)
    img.apply(topic_key("t"), topic_value(2), 20, 10)      # CreatePartitions: same id, more partitions
    assert "t" not in img.topics and img.partition("t", 0).leader_epoch == 3
    img.apply(partition_key("t", 1), partition_value([2, 1]), 20, 20)
    assert [p.leader for p in img.topics["t"].partitions] == [1, 2]


def test_unreadable_values_are_recorded_and_do_not_crash():
    img = image_with({"t": [([1, 2], [1, 2], 0)]}, brokers=(1, 2))
    bad = [
        (CONTROLLER_KEY, b"{not json"),
        (broker_key(5), b'{"host": "h"}'),                       # no port
        ("/canopy/brokers/five", encode({"host": "h", "port": 1})),  # not a node id
        (topic_key("u"), encode({"id": "not-a-uuid", "configs": {}, "fanout": 2, "partitions": 1})),
        (partition_key("t", 0), b"\xff\xfe"),
        (partition_key("t", 1), encode({"replicas": [1], "isr": [1]})),   # no leader_epoch
        (partition_key("t", 2), b"[1, 2]"),                      # JSON, but not an object
    ]
    for key, value in bad:
        assert img.apply(key, value, 30, 30) is None
    assert img.unreadable == [k for k, _ in bad]
    # Nothing readable was lost or half-applied.
    assert img.controller_id == -1 and set(img.brokers) == {1, 2}
    assert set(img.topics) == {"t"} and img.topics["t"].partitions[0].replicas == [1, 2]
    assert img.partition("t", 1) is None and img.partition("t", 2) is None


def test_a_put_with_an_empty_or_null_value_is_unreadable_not_a_delete():
    # Only a DELETE event removes a key. An empty or JSON-null value written over a topic
    # key (say a mistaken `etcdctl put /canopy/topics/t ""`) must not make every broker
    # forget the topic and remove its data, while etcd still holds the key.
    img = image_with({"t": [([1, 2], [1, 2], 0)]}, brokers=(1, 2))
    img.apply(CONTROLLER_KEY, encode({"node_id": 1}), 20, 20)
    for key in (topic_key("t"), partition_key("t", 0), broker_key(2), CONTROLLER_KEY):
        for value in (b"", b"null"):
            assert img.apply(key, value, 30, 30) is None
    assert set(img.topics) == {"t"} and set(img.brokers) == {1, 2} and img.controller_id == 1
    assert len(img.unreadable) == 8


def test_keys_outside_the_layout_are_ignored():
    img = ClusterImage()
    assert img.apply(PRODUCER_ID_BLOCK_KEY, encode({"next": 1000}), 5, 5) is None
    assert img.apply("/canopy/something-new", b"whatever", 6, 6) is None
    assert img.apply("/other/app/key", b"x", 7, 7) is None
    assert img.unreadable == [] and img.topics == {} and img.brokers == {}


def test_partition_value_round_trips_through_the_image():
    p = PartitionImage([4, 2, 9], 6, [4, 9])
    data = json.loads(p.to_value(controller_epoch=12))
    assert data == {"replicas": [4, 2, 9], "leader_epoch": 6, "isr": [4, 9], "controller_epoch": 12}
    img = ClusterImage()
    img.apply(partition_key("x", 0), p.to_value(12), 8, 8)
    assert img.partition("x", 0) == PartitionImage([4, 2, 9], 6, [4, 9], 8)


# -- changes_for_liveness ------------------------------------------------------------------------

def never(_topic: str) -> bool:
    return False


def test_dead_leader_gets_a_clean_election_with_a_promoted_tree_and_the_next_epoch():
    img = image_with({"t": [([1, 2, 3, 4], [1, 2, 3], 5)]})
    old = img.topics["t"].partitions[0]
    changes, offline = changes_for_liveness(img, {2, 3, 4}, never)
    assert offline == []
    [c] = changes
    assert (c.topic, c.index, c.old, c.reason) == ("t", 0, old, "clean election")
    assert c.new.replicas == [2, 3, 4, 1]        # re-rooted at 2; the old leader becomes the last leaf
    assert c.new.leader_epoch == 6 and c.new.isr == [2, 3]
    assert c.new.mod_revision == old.mod_revision   # the compare-and-swap is against what we read


def test_dead_follower_leaves_the_isr_at_the_same_epoch():
    img = image_with({"t": [([1, 2, 3], [1, 2, 3], 5)]})
    [c] = changes_for_liveness(img, {1, 2, 4}, never)[0]
    assert c.reason == "dead or restarted replica leaves the ISR"
    assert (c.new.replicas, c.new.leader_epoch, c.new.isr) == ([1, 2, 3], 5, [1, 2])


def test_dead_replica_outside_the_isr_changes_nothing():
    img = image_with({"t": [([1, 2, 3], [1, 2], 0)]})
    assert changes_for_liveness(img, {1, 2}, never) == ([], [])


def test_all_live_changes_nothing():
    img = image_with({"t": [([1, 2, 3], [1, 2, 3], 0)], "u": [([2], [2], 0), ([3, 1], [3, 1], 2)]})
    assert changes_for_liveness(img, {1, 2, 3, 4}, never) == ([], [])


def test_no_candidate_leaves_the_partition_offline_and_unchanged():
    img = image_with({"t": [([1, 2, 3], [1, 2], 3), ([2, 3], [2, 3], 0)]})
    changes, offline = changes_for_liveness(img, {3}, never)
    assert offline == [("t", 0)]
    [c] = changes                                  # partition 1 still has 3 in its ISR
    assert (c.index, c.new.leader, c.new.isr) == (1, 3, [3])


def test_unclean_election_is_decided_per_topic():
    img = image_with({"safe": [([1, 2, 3], [1, 2], 3)], "lossy": [([1, 2, 3], [1, 2], 3)]})
    changes, offline = changes_for_liveness(img, {3}, lambda topic: topic == "lossy")
    assert offline == [("safe", 0)]
    [c] = changes
    assert (c.topic, c.reason) == ("lossy", "UNCLEAN election")
    assert (c.new.replicas, c.new.leader_epoch, c.new.isr) == ([3, 2, 1], 4, [3])


def test_incomplete_topics_are_left_alone():
    img = image_with({"t": [([1, 2], [1, 2], 0)]})
    img.apply(topic_key("half"), TopicImage("half", uuid.uuid4(), {}, 2, 2).to_value(), 90, 90)
    img.apply(partition_key("half", 0), partition_value([1, 2]), 90, 90)
    changes, offline = changes_for_liveness(img, {2}, never)
    assert [(c.topic, c.index) for c in changes] == [("t", 0)]


# -- reassign (canopy cluster promote) ---------------------------------------------------------------

def test_reassign_with_the_same_leader_keeps_epoch_and_isr():
    p = PartitionImage([1, 2, 3, 4], 3, [1, 2, 3], 77)
    new = reassign(p, [1, 4, 3, 2])
    assert new == PartitionImage([1, 4, 3, 2], 3, [1, 2, 3], 77)


def test_reassign_to_a_new_leader_bumps_the_epoch_and_drops_the_old_leader_from_the_isr():
    p = PartitionImage([1, 2, 3, 4], 3, [1, 2, 3], 77)
    new = reassign(p, [3, 1, 2, 4])
    assert (new.replicas, new.leader_epoch, new.isr, new.mod_revision) == ([3, 1, 2, 4], 4, [3, 2], 77)


def test_reassign_does_not_alias_the_callers_lists():
    p = PartitionImage([1, 2], 0, [1, 2], 5)
    tree = [1, 2]
    new = reassign(p, tree)
    tree.append(9)
    new.isr.append(8)
    assert new.replicas == [1, 2] and p.isr == [1, 2]


# -- property: elections through the image -------------------------------------------------------

@st.composite
def clusters(draw):
    brokers = draw(st.lists(st.integers(0, 9), min_size=1, max_size=8, unique=True))
    fanout = draw(st.integers(1, 3))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        replicas = draw(st.permutations(brokers))[:draw(st.integers(1, len(brokers)))]
        isr = [replicas[0], *(c for c in children_of(replicas, replicas[0], fanout) if draw(st.booleans()))]
        parts.append((replicas, isr, draw(st.integers(0, 50))))
    live = {b for b in brokers if draw(st.booleans())}
    return parts, live, draw(st.booleans())


@given(clusters())
def test_every_elected_leader_is_live_and_clean_ones_come_from_the_old_isr(c):
    parts, live, unclean = c
    img = image_with({"t": parts}, brokers=())
    changes, offline = changes_for_liveness(img, live, lambda _t: unclean)
    touched = {ch.index for ch in changes} | {i for _, i in offline}
    for i, (replicas, isr, epoch) in enumerate(parts):
        needs_work = replicas[0] not in live or any(m not in live for m in isr)
        assert (i in touched) == needs_work
    for ch in changes:
        assert ch.new.leader in live and set(ch.new.isr) <= live and ch.new.isr[0] == ch.new.leader
        assert sorted(ch.new.replicas) == sorted(ch.old.replicas)
        if ch.old.leader in live:
            assert ch.new.leader == ch.old.leader and ch.new.leader_epoch == ch.old.leader_epoch
        else:
            assert ch.new.leader_epoch == ch.old.leader_epoch + 1 and ch.new.replicas[-1] == ch.old.leader
            if ch.reason == "clean election":
                assert ch.new.leader in ch.old.isr and set(ch.new.isr) <= set(ch.old.isr)
            else:
                assert unclean and not set(ch.old.isr) & live and ch.new.isr == [ch.new.leader]
    for _, i in offline:
        replicas, isr, _ = parts[i]
        assert not set(isr) & live and (not unclean or not set(replicas) & live)


# -- a restarted broker (a registration newer than the partition's state) ----------------------

def restart(img: ClusterImage, node: int, revision: int = 1000) -> None:
    img.apply(broker_key(node), encode({"host": "127.0.0.1", "port": 9000 + node, "rack": None}), revision, revision)


def test_a_restarted_leader_is_replaced_by_an_isr_member_that_did_not_restart():
    img = image_with({"t": [([1, 2, 3, 4], [1, 2, 3], 5)]})
    restart(img, 1)   # killed and back before its lease lapsed: its log may be gone
    [c] = changes_for_liveness(img, {1, 2, 3, 4}, never)[0]
    assert (c.new.leader, c.new.leader_epoch) == (2, 6)
    assert c.new.isr == [2, 3] and c.new.replicas[-1] == 1


def test_a_restarted_follower_leaves_the_isr_until_it_catches_up():
    img = image_with({"t": [([1, 2, 3], [1, 2, 3], 5)]})
    restart(img, 3)
    [c] = changes_for_liveness(img, {1, 2, 3}, never)[0]
    assert (c.new.leader, c.new.leader_epoch, c.new.isr) == (1, 5, [1, 2])


def test_when_every_isr_member_restarted_one_of_them_leads_again_with_a_new_epoch():
    img = image_with({"t": [([1, 2, 3], [1, 2], 5)]})
    restart(img, 1, 1000)
    restart(img, 2, 1001)
    [c] = changes_for_liveness(img, {1, 2, 3}, never)[0]
    assert (c.new.leader, c.new.leader_epoch, c.new.replicas) == (1, 6, [1, 2, 3])
    assert c.reason == "clean election"


def test_once_the_controller_wrote_a_newer_state_a_restart_is_old_news():
    img = image_with({"t": [([1, 2, 3], [1, 2, 3], 5)]})
    restart(img, 1, 1000)
    img.apply(partition_key("t", 0), partition_value([2, 3, 1], [2, 3], 6), 1001, 20)
    assert changes_for_liveness(img, {1, 2, 3}, never) == ([], [])
