"""Fixtures for the PySpark tests: one lean local[2] SparkSession for the whole run (JVM
start-up is the dominant cost) and the real-broker fixtures of tests/e2e."""
from __future__ import annotations

import pytest

from tests.e2e.conftest import (  # noqa: F401  (fixtures re-exported for pytest)
    IN_CI,
    BrokerProcess,
    broker,
    broker_factory,
    free_port,
    require_tool,
)

if not IN_CI:  # in CI a missing pyspark must fail, never skip
    pytest.importorskip("pyspark", reason="pyspark missing: `make test` installs the spark extra")


@pytest.fixture(scope="session")
def spark():
    from pipelines.click_counts import spark_session

    s = spark_session("canopy-spark-tests")
    yield s
    s.stop()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)


def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every record of `topic` through a plain confluent-kafka consumer (an oracle
    independent of the PySpark source)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "oracle",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=timeout).topics[topic]
        tps = [TopicPartition(topic, p, 0) for p in md.partitions]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=timeout)[1] for tp in tps}
        c.assign(tps)
        pos = {p: 0 for p in ends}
        out = []
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"oracle read of {topic} timed out at {pos} / {ends}"
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                out.append(m)
                pos[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()
