"""The `canopy` PySpark source and sink against a real canopy process: batch reads by
timestamp range, micro-batch exactly-once across restarts, and the writer read back by kcat."""
from __future__ import annotations

import json
import random
from collections import Counter
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Producer

from .conftest import create_topic, read_all, require_tool

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def produce_timestamped(bootstrap, topic, partitions, n, seed=1):
    """n records spread over partitions, timestamps strictly increasing per partition in
    irregular steps; returns [(partition, offset, ts, value)]."""
    rng = random.Random(seed)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    ts = {i: T0 for i in range(partitions)}
    sent = []
    for i in range(n):
        part = rng.randrange(partitions)
        ts[part] += rng.randrange(1, 2000)
        value = f"v{i}".encode()
        p.produce(topic, value=value, key=str(i).encode(), partition=part, timestamp=ts[part])
        sent.append((part, ts[part], value))
    assert p.flush(30) == 0
    offsets = {i: 0 for i in range(partitions)}
    out = []
    for part, t, v in sent:
        out.append((part, offsets[part], t, v))
        offsets[part] += 1
    return out


def reader(spark, bootstrap, **opts):
    r = spark.read.format("canopy").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_by_timestamp_range(spark, broker):
    create_topic(broker.bootstrap, "ts", 3)
    recs = produce_timestamped(broker.bootstrap, "ts", 3, 900)
    lo, hi = T0 + 150_000, T0 + 400_000
    expected = sorted((p, o, v) for p, o, t, v in recs if lo <= t < hi)
    assert 100 < len(expected) < 800

    df = reader(spark, broker.bootstrap, subscribe="ts",
                startingTimestamp=str(lo), endingTimestamp=str(hi))
    rows = df.collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == expected
    assert all(lo <= int(r.timestamp.timestamp() * 1000) < hi for r in rows)
    assert {r.timestampType for r in rows} == {0} and {r.topic for r in rows} == {"ts"}

    # the per-partition form, as JSON, gives the same rows
    per = json.dumps({"ts": {str(p): lo for p in range(3)}})
    per_end = json.dumps({"ts": {str(p): hi for p in range(3)}})
    df2 = reader(spark, broker.bootstrap, subscribe="ts",
                 startingOffsetsByTimestamp=per, endingOffsetsByTimestamp=per_end)
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in df2.collect()) == expected

    # a start past every record: Spark's default strategy is an error, "latest" reads nothing
    with pytest.raises(Exception, match="No offset matched"):
        reader(spark, broker.bootstrap, subscribe="ts", startingTimestamp=str(T0 + 10**9)).collect()
    assert reader(spark, broker.bootstrap, subscribe="ts", startingTimestamp=str(T0 + 10**9),
                  startingOffsetsByTimestampStrategy="latest").count() == 0


def test_batch_offsets_assign_pattern_and_headers(spark, broker):
    create_topic(broker.bootstrap, "orders-a", 2)
    create_topic(broker.bootstrap, "orders-b", 1)
    create_topic(broker.bootstrap, "other", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for t, n in (("orders-a", 40), ("orders-b", 10), ("other", 5)):
        for i in range(n):
            p.produce(t, value=b"x%d" % i, partition=i % (2 if t == "orders-a" else 1),
                      headers=[("n", str(i).encode()), ("empty", b"")])
    assert p.flush(30) == 0

    df = reader(spark, broker.bootstrap, subscribePattern="orders-.*", includeHeaders="true")
    assert df.columns[-1] == "headers"
    rows = df.collect()
    assert dict(Counter(r.topic for r in rows)) == {"orders-a": 40, "orders-b": 10}
    r0 = [r for r in rows if r.topic == "orders-b" and r.offset == 3][0]
    assert [(h.key, bytes(h.value)) for h in r0.headers] == [("n", b"3"), ("empty", b"")]

    df = reader(spark, broker.bootstrap, assign=json.dumps({"orders-a": [1]}),
                startingOffsets=json.dumps({"orders-a": {"1": 5}}),
                endingOffsets=json.dumps({"orders-a": {"1": 15}}))
    assert sorted(r.offset for r in df.collect()) == list(range(5, 15))
    assert "headers" not in df.columns


def stream_to_parquet(spark, bootstrap, topic, out: Path, ck: Path, **opts):
    r = (spark.readStream.format("canopy").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in opts.items():
        r = r.option(k, v)
    q = (r.load().selectExpr("partition", "offset", "value")
         .writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert q.exception() is None
    return q


def last_offsets(ck: Path, batch: int) -> dict:
    # checkpoint/offsets/<n>: version line, metadata line, then one JSON line per source
    return json.loads((ck / "offsets" / str(batch)).read_text().splitlines()[-1])


def test_stream_restart_replays_uncommitted_batch_once(spark, broker, tmp_path):
    """Exactly-once across restarts: offsets are planned by the source, logged by Spark,
    and a batch whose commit never happened is re-run over the very same ranges."""
    create_topic(broker.bootstrap, "ev", 2)
    produce_timestamped(broker.bootstrap, "ev", 2, 500, seed=3)
    out, ck = tmp_path / "out", tmp_path / "ck"

    q1 = stream_to_parquet(spark, broker.bootstrap, "ev", out, ck, maxOffsetsPerTrigger="200")
    done1 = [p.batchId for p in q1.recentProgress if p.numInputRows]
    assert done1 == [0, 1, 2]
    assert all(p.numInputRows <= 200 for p in q1.recentProgress)
    # consecutive batches tile the offset space
    for b in range(2):
        assert last_offsets(ck, b + 1) != last_offsets(ck, b)
    planned2 = last_offsets(ck, 2)

    # Simulate a crash after batch 2 was planned and written but before it was committed.
    (ck / "commits" / "2").unlink()
    (ck / "commits" / ".2.crc").unlink(missing_ok=True)  # Hadoop's checksum side file
    produce_timestamped(broker.bootstrap, "ev", 2, 300, seed=4)
    q2 = stream_to_parquet(spark, broker.bootstrap, "ev", out, ck, maxOffsetsPerTrigger="200")
    # (the file sink, finding batch 2 in its own log, skips re-writing it: 0 input rows)
    progress = list(q2.recentProgress)
    assert progress[0].batchId == 2
    assert json.loads(progress[0].sources[0].endOffset) == planned2  # same range, re-run
    assert [p.batchId for p in progress] == list(range(2, 2 + len(progress)))
    assert sum(p.numInputRows for p in progress[1:]) == 300

    rows = spark.read.parquet(str(out)).collect()
    seen = sorted((r.partition, r.offset) for r in rows)
    assert len(seen) == len(set(seen)) == 800  # nothing lost, nothing twice
    ends = {p: max(o for q, o in seen if q == p) + 1 for p in (0, 1)}
    assert seen == sorted((p, o) for p in (0, 1) for o in range(ends[p]))


def test_writer_output_reads_back_intact_with_kcat(spark, broker, tmp_path):
    kcat = require_tool("kcat", "reading the writer's output back")
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    create_topic(broker.bootstrap, "sink", 2)
    rng = random.Random(7)
    rows = []
    for i in range(300):
        value = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 3000)))
        rows.append((f"key-{i}", value, i % 2))
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType()),
                         StructField("partition", IntegerType())])
    (spark.createDataFrame(rows, schema).repartition(2)
     .write.format("canopy").option("kafka.bootstrap.servers", broker.bootstrap)
     .option("topic", "sink").mode("append").save())

    # streaming writer too: the topic column routes each row
    stream_in = "sink-src"
    create_topic(broker.bootstrap, stream_in, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(50):
        p.produce(stream_in, key=b"s%d" % i, value=b"stream-%d" % i)
    assert p.flush(30) == 0
    q = (spark.readStream.format("canopy").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("subscribe", stream_in).option("startingOffsets", "earliest").load()
         .selectExpr("'sink-stream' AS topic", "key", "value")
         .writeStream.format("canopy").option("kafka.bootstrap.servers", broker.bootstrap)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert q.exception() is None

    def kcat_read(topic):
        out = subprocess.run([kcat, "-b", broker.bootstrap, "-C", "-t", topic, "-e", "-q", "-J"],
                             capture_output=True, timeout=60, check=True)
        return [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]

    got = kcat_read("sink")
    assert len(got) == 300
    by_key = {m["key"]: m for m in got}
    for key, value, part in rows:
        m = by_key[key]
        assert m["payload"].encode() == value and m["partition"] == part
    # per partition, kcat sees offsets 0..n-1 with no gaps
    for part in (0, 1):
        offs = sorted(m["offset"] for m in got if m["partition"] == part)
        assert offs == list(range(len(offs)))

    got = kcat_read("sink-stream")
    assert sorted((m["key"], m["payload"]) for m in got) == sorted((f"s{i}", f"stream-{i}") for i in range(50))
    assert len(read_all(broker.bootstrap, "sink-stream")) == 50


def test_fail_on_data_loss_after_delete_records(spark, broker):
    """Offsets planned (here: asked for) but cut by DeleteRecords: failOnDataLoss=true (the
    default) fails the query, false skips to the new log start — as Spark's source does."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, "cut", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(100):
        p.produce("cut", value=b"%d" % i, partition=0)
    assert p.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.delete_records([TopicPartition("cut", 0, 40)]).values():
        assert f.result(30).low_watermark == 40

    start = json.dumps({"cut": {"0": 10}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(spark, broker.bootstrap, subscribe="cut", startingOffsets=start).collect()
    rows = reader(spark, broker.bootstrap, subscribe="cut", startingOffsets=start,
                  failOnDataLoss="false").collect()
    assert [(r.offset, bytes(r.value)) for r in rows] == [(i, b"%d" % i) for i in range(40, 100)]
    # "earliest" means the log start offset, not 0
    assert reader(spark, broker.bootstrap, subscribe="cut").count() == 60


def test_stream_pattern_picks_up_new_topic_from_its_start(spark, broker, tmp_path):
    """subscribePattern: a topic created between runs is read from its log start, the old
    one continues where the checkpoint left it."""
    def send(topic, lo, hi):
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(lo, hi):
            p.produce(topic, value=b"%s-%d" % (topic.encode(), i))
        assert p.flush(30) == 0

    create_topic(broker.bootstrap, "grow-a", 1)
    send("grow-a", 0, 50)

    def run():
        q = (spark.readStream.format("canopy").option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribePattern", "^grow-").option("startingOffsets", "earliest").load()
             .selectExpr("topic", "offset", "value")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(240)
        assert q.exception() is None

    run()
    create_topic(broker.bootstrap, "grow-b", 2)
    send("grow-b", 0, 30)
    send("grow-a", 50, 70)
    run()
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    got = sorted(bytes(r.value) for r in rows)
    assert len(got) == len(set(got)) == 100
    assert got == sorted([b"grow-a-%d" % i for i in range(70)] + [b"grow-b-%d" % i for i in range(30)])
