"""Metadata's partitions of a single node are encoded once per version and kept on the
topic (broker/handlers/metadata.py): the wire bytes must be those of a fresh encoding, and
must follow every change the answer is made of."""
import pytest
import trio

from broker.handlers import metadata
from protocol.messages import api
from protocol.schema import SchemaError
from tests.unit.test_groups_coordinator import Ctx, make_broker

SCHEMA = api(3).response


def answer(broker, version: int) -> dict:
    async def go():
        return await metadata.handle(Ctx(broker), {"topics": [{"name": "t"}]}, version)
    return SCHEMA.decode(SCHEMA.encode(trio.run(go), version), version)


def expected(broker, version: int) -> dict:
    """The same answer built without the cache, as plain dicts."""
    node = broker.node_id
    t = broker.topics.get("t")
    response = {"throttle_time_ms": 0, "brokers": broker.brokers(None), "cluster_id": broker.config.cluster_id,
                "controller_id": broker.controller_id,
                "topics": [{"error_code": 0, "name": "t", "topic_id": t.topic_id, "is_internal": False,
                            "partitions": [{"error_code": 0, "partition_index": p.index, "leader_id": node,
                                            "leader_epoch": p.leader_epoch, "replica_nodes": [node],
                                            "isr_nodes": [node], "offline_replicas": []}
                                           for p in t.partitions]}]}
    return SCHEMA.decode(SCHEMA.encode(response, version), version)


@pytest.mark.parametrize("version", range(13))
def test_cached_partitions_are_a_fresh_encoding_and_follow_changes(tmp_path, version):
    b = make_broker(tmp_path)   # topic "t", 4 partitions
    try:
        for _ in range(2):   # the first answer fills the cache, the second reads it
            assert answer(b, version)["topics"] == expected(b, version)["topics"]
        b.topics.get("t").partitions[2].leader_epoch = 7
        got = answer(b, version)["topics"]
        assert got == expected(b, version)["topics"]
        if version >= 7:   # leader_epoch is on the wire from v7
            assert got[0]["partitions"][2]["leader_epoch"] == 7
        b.topics.add_partitions("t", 6)
        got = answer(b, version)["topics"]
        assert len(got[0]["partitions"]) == 6 and got == expected(b, version)["topics"]
    finally:
        b.close()


@pytest.mark.parametrize("version", [1, 12])
def test_encode_array_is_the_array_as_the_whole_message_encodes_it(version):
    parts = [{"partition_index": i, "leader_id": 3, "replica_nodes": [3, 1], "isr_nodes": [3]} for i in range(5)]
    plain = {"topics": [{"name": "x", "partitions": parts}]}
    pre = {"topics": [{"name": "x", "partitions": SCHEMA.encode_array(version, ("topics", "partitions"), parts)}]}
    assert SCHEMA.encode(pre, version) == SCHEMA.encode(plain, version)


@pytest.mark.parametrize("version", range(13))
def test_copies_of_one_partition_are_the_array_encoded_element_by_element(version):
    template = {"error_code": 0, "leader_id": 3, "leader_epoch": 5, "replica_nodes": [3, 1], "isr_nodes": [3],
                "offline_replicas": []}
    indexes = [0, 1, 2, 7, 2**31 - 1]
    copies = SCHEMA.encode_array_of_copies(version, ("topics", "partitions"), template, "partition_index", indexes)
    plain = SCHEMA.encode_array(version, ("topics", "partitions"), [{**template, "partition_index": i} for i in indexes])
    assert copies.data == plain.data


def test_copies_refuse_what_they_cannot_patch():
    with pytest.raises(SchemaError):   # int16, not int32
        SCHEMA.encode_array_of_copies(12, ("topics", "partitions"), {}, "error_code", [1])
    with pytest.raises(SchemaError):   # out of int32's range
        SCHEMA.encode_array_of_copies(12, ("topics", "partitions"), {}, "partition_index", [2**31])


def test_copies_of_a_field_past_the_leading_run_are_encoded_one_by_one():
    template = {"node_id": 1, "host": "h", "rack": None}   # port follows the host string
    copies = SCHEMA.encode_array_of_copies(12, ("brokers",), template, "port", [9092, 9093])
    assert copies.data == SCHEMA.encode_array(12, ("brokers",), [{**template, "port": p} for p in (9092, 9093)]).data
