"""Admin APIs on a real 3-broker cluster (etcd metadata): an AlterConfigs sent to one
broker reaches every broker through etcd and changes what each one does and shows
(topic overrides and the cluster-wide dynamic broker default), and ElectLeaders goes
through the controller (preferred election back to the preferred replica; unclean
election refused while the leader lives). CreateTopics works from the moment a new
cluster's first broker listens."""
from __future__ import annotations

import pytest
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                   NewTopic, ResourceType)

from tests.e2e.conftest import BrokerProcess
from tests.e2e.rawclient import RawClient
from tests.etcd_cluster import etcd_cluster  # noqa: F401  (pytest fixture: a real 3-member etcd)

from .conftest import cluster_metadata, wait_for
from .conftest import partition_metadata as metadata
from .test_cluster_cli import cluster3, create_topic  # noqa: F401  (cluster3 is a fixture)

pytestmark = pytest.mark.timeout(300)


def _describe(bootstrap: str, topic: str) -> dict:
    c = RawClient(bootstrap)
    try:
        r = c.request(32, 4, {"resources": [{"resource_type": 2, "resource_name": topic,
                                             "configuration_keys": None}],
                              "include_synonyms": False, "include_documentation": False})
    finally:
        c.close()
    res = r["results"][0]
    assert res["error_code"] == 0, res
    return {c["name"]: (c["value"], c["config_source"]) for c in res["configs"]}


def test_alter_configs_on_one_broker_changes_every_broker(cluster3):
    topic = "altered"
    create_topic(cluster3, topic)
    wait_for(lambda: all(len(isr) == 3 for _, _, _, isr in metadata(cluster3[1].bootstrap, topic).values()),
             "full ISR")
    controller = cluster_metadata(cluster3[1].bootstrap, [])["controller_id"]
    leader = metadata(cluster3[1].bootstrap, topic)[0][0]
    # Send the change to a broker that is not the controller (it forwards, as Kafka's do),
    # and preferably not the leader (the leader must learn it from etcd).
    via = next((n for n in cluster3 if n not in (controller, leader)), next(n for n in cluster3 if n != controller))
    admin = AdminClient({"bootstrap.servers": cluster3[via].bootstrap})
    # librdkafka sends a TOPIC resource to any broker, a BROKER resource to that broker.
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "10000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=20)[res].result(timeout=30)
    # The cluster-wide default (empty broker name; confluent-kafka cannot name it, the
    # Java client and kafka-configs --entity-default can): a raw IncrementalAlterConfigs.
    c = RawClient(cluster3[via].bootstrap)
    try:
        r = c.request(44, 1, {"validate_only": False, "resources": [{"resource_type": 4, "resource_name": "",
                                                                    "configs": [{"name": "log.retention.ms",
                                                                                 "config_operation": 0,
                                                                                 "value": "3600000"}]}]})
    finally:
        c.close()
    assert r["responses"][0]["error_code"] == 0, r

    for n, b in cluster3.items():
        wait_for(lambda: _describe(b.bootstrap, topic)["max.message.bytes"] == ("10000", 1)
                 and _describe(b.bootstrap, topic)["retention.ms"] == ("3600000", 3),
                 f"broker {n} shows the altered configs")

    # The leader enforces the new limit at once: a 50 kB record is refused, a small one is not.
    errors = []
    p = Producer({"bootstrap.servers": ",".join(b.bootstrap for b in cluster3.values()),
                  "message.timeout.ms": 20000, "message.max.bytes": 2_000_000})
    p.produce(topic, value=b"x" * 50_000, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    p.produce(topic, value=b"small", on_delivery=lambda err, msg: errors.append(err))   # a batch of its own
    assert p.flush(30) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors
    assert errors[1] is None, errors

    # A bad value is refused with Kafka's answer, and nothing changes anywhere.
    bad = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "-7", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as ei:
        admin.incremental_alter_configs([bad], request_timeout=20)[bad].result(timeout=30)
    assert ei.value.args[0].code() == KafkaError.INVALID_CONFIG
    for b in cluster3.values():
        assert _describe(b.bootstrap, topic)["retention.ms"] == ("3600000", 3)


def test_elect_leaders_through_the_controller(cluster3):
    topic = "elect"
    create_topic(cluster3, topic)
    wait_for(lambda: all(len(isr) == 3 for _, _, _, isr in metadata(cluster3[1].bootstrap, topic).values()),
             "full ISR")
    leader, epoch, replicas, _ = metadata(cluster3[1].bootstrap, topic)[0]
    preferred = sorted(replicas)[0]   # replication.tree.preferred_leader for partition 0
    admin = AdminClient({"bootstrap.servers": cluster3[1].bootstrap})
    tp = TopicPartition(topic, 0)
    if leader == preferred:
        r = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=30)
        assert r[tp].code() == KafkaError.ELECTION_NOT_NEEDED, r
        # Move leadership away (AlterPartitionReassignments, as `canopy cluster promote`).
        other = next(n for n in replicas if n != preferred)
        c = RawClient(cluster3[1].bootstrap)
        try:
            out = c.request(45, 0, {"timeout_ms": 10000, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "replicas": [other, *(n for n in replicas if n != other)]}]}]})
        finally:
            c.close()
        assert out["responses"][0]["partitions"][0]["error_code"] == 0, out
        wait_for(lambda: metadata(cluster3[1].bootstrap, topic)[0][0] == other, "leadership moved")
        wait_for(lambda: len(metadata(cluster3[1].bootstrap, topic)[0][3]) == 3, "preferred back in the ISR")
    # Unclean election is refused while the leader lives.
    r = admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(timeout=30)
    assert r[tp].code() == KafkaError.ELECTION_NOT_NEEDED, r
    r = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=30)
    assert r[tp] is None, r
    for b in cluster3.values():
        wait_for(lambda: metadata(b.bootstrap, topic)[0][0] == preferred, "preferred leader on every broker")


def test_unclean_election_brings_an_offline_partition_back(cluster3):
    """Replicas [A, B] of a partition, unclean.leader.election.enable false: B dies (the
    controller drops it from the ISR), then the leader A dies, so the partition is offline.
    B comes back but is out of the ISR: no clean election can pick it. A preferred election
    answers PREFERRED_LEADER_NOT_AVAILABLE; an unclean one (Kafka's ElectionType.UNCLEAN)
    makes B the leader with an ISR of itself, and it serves what it had."""
    from confluent_kafka.admin import NewTopic
    topic = "offline"
    admin = AdminClient({"bootstrap.servers": cluster3[1].bootstrap})
    admin.create_topics([NewTopic(topic, 1, 2)])[topic].result(15)
    wait_for(lambda: all(len(metadata(b.bootstrap, topic)[0][3]) == 2 for b in cluster3.values()), "ISR of 2")
    a, b = metadata(cluster3[1].bootstrap, topic)[0][2]
    (c,) = set(cluster3) - {a, b}
    p = Producer({"bootstrap.servers": ",".join(x.bootstrap for x in cluster3.values()), "acks": "all"})
    for i in range(10):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(30) == 0

    cluster3[b].kill9()
    wait_for(lambda: metadata(cluster3[c].bootstrap, topic)[0][3] == [a], "dead follower dropped from the ISR")
    cluster3[a].kill9()
    wait_for(lambda: metadata(cluster3[c].bootstrap, topic)[0][0] == -1, "partition offline")
    admin = AdminClient({"bootstrap.servers": cluster3[c].bootstrap})
    tp = TopicPartition(topic, 0)
    r = admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(timeout=30)
    assert r[tp].code() == KafkaError.ELIGIBLE_LEADERS_NOT_AVAILABLE, r   # nobody alive to lead

    cluster3[b].start()
    wait_for(lambda: b in [x["node_id"] for x in cluster_metadata(cluster3[c].bootstrap, [])["brokers"]],
             "restarted replica registered", timeout=60)
    assert metadata(cluster3[c].bootstrap, topic)[0][0] == -1   # still offline: b is out of the ISR
    r = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=30)
    assert r[tp].code() == KafkaError.PREFERRED_LEADER_NOT_AVAILABLE, r
    r = admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(timeout=30)
    assert r[tp] is None, r
    wait_for(lambda: metadata(cluster3[c].bootstrap, topic)[0][0] == b
             and metadata(cluster3[c].bootstrap, topic)[0][3] == [b], "unclean leader elected")

    def end_offset_on_b():
        conn = RawClient(cluster3[b].bootstrap)
        try:
            r = conn.request(2, 7, {"replica_id": -1, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "timestamp": -1}]}]})
        finally:
            conn.close()
        part = r["topics"][0]["partitions"][0]
        return part["offset"] if part["error_code"] == 0 else None

    # b serves as leader once it has applied the election; it kept what it had replicated.
    assert wait_for(end_offset_on_b, "the new leader answering") == 10


def test_topics_of_more_partitions_than_an_etcd_transaction_holds(cluster3):
    """etcd refuses a transaction of more than 128 operations (--max-txn-ops): the
    controller writes a large topic in several, and every broker shows it whole (or not
    at all) with a leader for each partition; CreatePartitions grows it the same way."""
    admin = AdminClient({"bootstrap.servers": cluster3[1].bootstrap})
    admin.create_topics([NewTopic("wide", 300, 2)], operation_timeout=60, request_timeout=90)["wide"].result(90)

    def led_everywhere(count):
        for b in cluster3.values():
            parts = metadata(b.bootstrap, "wide")
            if sorted(parts) != list(range(count)) or any(leader < 0 for leader, *_ in parts.values()):
                return False
        return True
    wait_for(lambda: led_everywhere(300), "300 partitions, each led, on every broker")
    admin.create_partitions([NewPartitions("wide", 450)], operation_timeout=60,
                            request_timeout=90)["wide"].result(90)
    wait_for(lambda: led_everywhere(450), "450 partitions, each led, on every broker")
    p = Producer({"bootstrap.servers": cluster3[1].bootstrap, "acks": "all"})
    for i in (0, 299, 449):
        p.produce("wide", b"v%d" % i, partition=i)
    assert p.flush(60) == 0


def test_create_topics_sent_as_soon_as_a_new_cluster_listens(tmp_path, etcd_cluster):
    """A broker listens before the first controller election. librdkafka's admin client,
    told controller -1 by Metadata, refreshes metadata once and then waits for a broker
    state change that never comes: a CreateTopics sent the moment a new cluster's broker
    accepted connections (a compose file's topic-creating step) hung until its timeout.
    Brokers now answer Metadata with the controller once it is elected."""
    b = BrokerProcess(tmp_path / "node1", extra_args=["--node-id", "1"],
                      env={"CANOPY_METADATA_STORE": etcd_cluster.endpoints})
    b.start()   # returns as soon as the port accepts a connection
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("early", 1, 1)], request_timeout=30)["early"].result(40)
        assert metadata(b.bootstrap, "early")[0][0] == 1
    finally:
        b.stop()
