"""A Spark batch read of a compacted topic (issue 12, proof 1): the `canopy` PySpark source
reads across the gaps the cleaner leaves (invisible offsets, as Spark's Kafka source skips
them) with failOnDataLoss=true, and gets exactly what a plain consumer gets."""
from __future__ import annotations

import random
import re
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from .conftest import read_all


def test_batch_read_of_a_compacted_topic(spark, broker_factory):
    broker = broker_factory(env={"CANOPY_LOG_CLEANER_BACKOFF_MS": "300"})
    topic = f"table-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": str(64 << 10),
        "min.cleanable.dirty.ratio": "0.01"})])[topic].result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "batch.num.messages": 200})   # many batches: the cleaner keeps or drops records per batch
    rng = random.Random(3)
    for i in range(20_000):
        key = b"k%03d" % rng.randrange(300)
        value = None if i % 101 == 0 else b"v%05d" % i
        p.produce(topic, key=key, value=value)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    # wait for the cleanings to be over: no new one for 3 s (the cleaner looks every 0.3 s)
    def cleanings():
        return len(re.findall(rf"cleaned {topic}-0 ", broker.log_path.read_text(errors="replace")))
    deadline = time.monotonic() + 90
    seen, since = -1, time.monotonic()
    while cleanings() == 0 or cleanings() != seen or time.monotonic() - since < 3:
        assert time.monotonic() < deadline, "cleaning did not settle\n" + broker.log_text()
        if cleanings() != seen:
            seen, since = cleanings(), time.monotonic()
        time.sleep(0.3)
    oracle = [(m.offset(), m.key(), m.value()) for m in read_all(broker.bootstrap, topic)]
    assert len(oracle) < 20_000 // 2, "not compacted"
    rows = (spark.read.format("canopy").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").option("failOnDataLoss", "true").load().collect())
    got = sorted((r.offset, bytes(r.key), None if r.value is None else bytes(r.value)) for r in rows)
    assert got == sorted(oracle)
