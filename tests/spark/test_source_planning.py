"""The source's two halves without a SparkSession, against a real canopy process: the
executors' range read (`read_range` / `read_partition`) returns exactly the planned offsets
whatever the chunking, and the driver's stream reader resolves its initial offsets once and
reports what its last latestOffset saw."""
from __future__ import annotations

import datetime as dt

from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from canopy_spark import kafka as K
from canopy_spark.source import CanopyStreamReader, OffsetRange, read_partition

from .conftest import create_topic

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def produce(bootstrap: str, topic: str, n: int, first: int = 0) -> None:
    # linger 0 and small batches: the log holds many record batches, so ranges start and
    # end inside batches and consume() chunks cut across them.
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 13})
    for i in range(first, first + n):
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0,
                  timestamp=T0 + i)
        if i % 50 == 0:
            p.flush(30)
    assert p.flush(30) == 0


def test_range_read_returns_exactly_the_planned_offsets(broker):
    create_topic(broker.bootstrap, "r", 1)
    produce(broker.bootstrap, "r", 400)
    conf = K.client_config({"kafka.bootstrap.servers": broker.bootstrap})
    for start, until, chunk in [(0, 400, 7), (0, 400, 10_000), (3, 251, 7), (250, 251, 7),
                                (399, 400, 1), (17, 300, 64)]:
        got = [m.offset() for msgs in K.read_range(conf, "r", 0, start, until, True, 30.0, chunk)
               for m in msgs]
        assert got == list(range(start, until)), (start, until, chunk)

    batches = list(read_partition({"kafka.bootstrap.servers": broker.bootstrap},
                                  OffsetRange("r", 0, 5, 390)))
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(5, 390))
    assert all(r["topic"] == "r" and r["partition"] == 0 and r["timestampType"] == 0 for r in rows)
    assert [r["value"] for r in rows] == [f"v{i}".encode() for i in range(5, 390)]
    assert [r["key"] for r in rows] == [f"k{i}".encode() for i in range(5, 390)]
    assert rows[0]["timestamp"] == dt.datetime.fromtimestamp((T0 + 5) / 1000, dt.timezone.utc)


def test_range_read_asks_for_no_more_records_than_the_range_holds(broker, monkeypatch):
    # confluent-kafka's consume(num_messages, timeout) returns only once it holds
    # num_messages or the timeout has passed. Asking for a whole chunk when fewer records
    # were left made the last call of every range, and the only call of a small
    # micro-batch, sit out the whole 0.5 s timeout. The real consumer underneath is
    # watched, not replaced.
    create_topic(broker.bootstrap, "s", 1)
    produce(broker.bootstrap, "s", 120)
    conf = K.client_config({"kafka.bootstrap.servers": broker.bootstrap})
    asked: list[int] = []
    real = K.executor_consumer

    class Watched:
        def __init__(self, consumer):
            self._consumer = consumer

        def consume(self, num_messages, timeout):
            asked.append(num_messages)
            return self._consumer.consume(num_messages=num_messages, timeout=timeout)

        def __getattr__(self, name):
            return getattr(self._consumer, name)

    monkeypatch.setattr(K, "executor_consumer", lambda c: Watched(real(c)))
    got = [m.offset() for msgs in K.read_range(conf, "s", 0, 10, 110, True, 30.0) for m in msgs]
    assert got == list(range(10, 110))
    assert asked[0] == 100 and max(asked) <= 100, asked


def test_stream_reader_resolves_initial_offsets_once(broker):
    """Spark asks for initialOffset more than once before it logs batch 0; with
    startingOffsets=latest every answer must be the same start (Spark's own source resolves
    initialPartitionOffsets once), or rows produced in between would fall into no batch."""
    create_topic(broker.bootstrap, "s", 1)
    produce(broker.bootstrap, "s", 20)
    reader = CanopyStreamReader(K.lower_options({
        "kafka.bootstrap.servers": broker.bootstrap, "subscribe": "s",
        "startingOffsets": "latest", "maxOffsetsPerTrigger": "4"}))
    try:
        first = reader.initialOffset()
        assert first == {"s": {"0": 20}}
        produce(broker.bootstrap, "s", 10, first=20)
        assert reader.initialOffset() == first
        # Rate-limited end for the batch, but the progress report shows the broker's end
        # that call saw (Spark's KafkaMicroBatchStream.reportLatestOffset).
        assert reader.latestOffset(first, reader.getDefaultReadLimit()) == {"s": {"0": 24}}
        assert reader.reportLatestOffset() == {"s": {"0": 30}}
        assert reader.latestOffset(first, ReadAllAvailable()) == {"s": {"0": 30}}
        assert [repr(p) for p in reader.partitions(first, {"s": {"0": 30}})] == \
            ["OffsetRange(s-0 [20, 30))"]
    finally:
        reader.stop()
