"""Admin APIs on a real 3-broker cluster (etcd metadata): an AlterConfigs sent to one
broker reaches every broker through etcd and changes what each one does and shows
(topic overrides and the cluster-wide dynamic broker default), and ElectLeaders goes
through the controller (preferred election back to the preferred replica; unclean
election refused while the leader lives)."""
from __future__ import annotations

import pytest
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.e2e.rawclient import RawClient

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
