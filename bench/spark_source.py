"""Records/s through the `canopy` PySpark source vs a plain confluent-kafka consumer.

    .venv/bin/python bench/spark_source.py [--records 200000] [--size 1024] [--partitions 2]

Starts `canopy serve` on a free loopback port with a temporary data directory, produces
N records of SIZE random bytes over P partitions once, then reads them all back:

  confluent   one Consumer assign()ed to every partition, consume(10000) until N records
              (no per-record Python work beyond the loop) — the reference;
  spark batch spark.read.format("canopy") -> write.format("noop") on local[2]: every row
              goes through the executors' Python read, Arrow, and into the JVM;
  spark stream readStream.format("canopy") availableNow -> noop sink (one micro-batch).
  floor batch / floor stream
              the same two queries on `canopy_floor`, a Python data source defined here
              with the canopy source's schema, partitions and 10 000-row Arrow batches,
              built once per partition with no Kafka and no per-record Python: what Spark
              itself costs to bring these rows through any Python source on this machine,
              so the best ratio the canopy source could reach.

Spark start-up and a warm-up read (Python workers, JIT) are excluded. Printed as a table
with the 1-minute load average before and after (the readers share 2 vCPUs with whatever
else runs, so only ratios from one run compare) and written to
bench/results/spark-<timestamp>.json; the ratio is spark ÷ confluent.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker(data_dir: str, port: int) -> subprocess.Popen:
    canopy = Path(sys.executable).parent / "canopy"
    cmd = [str(canopy), "serve", "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}", "--node-id", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("canopy did not start")


def produce(bootstrap: str, topic: str, n: int, size: int, partitions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1048576,
                  "acks": 1, "enable.idempotence": False})
    payload = os.urandom(size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def confluent_read(bootstrap: str, topic: str, n: int, partitions: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 32 << 20})
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    while got < n:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    dt = time.perf_counter() - t0
    c.close()
    return dt


def spark_batch(spark, bootstrap: str, topic: str, source: str = "canopy") -> float:
    t0 = time.perf_counter()
    (spark.read.format(source).option("kafka.bootstrap.servers", bootstrap)
     .option("subscribe", topic).load().write.format("noop").mode("overwrite").save())
    return time.perf_counter() - t0


def spark_stream(spark, bootstrap: str, topic: str, ck: str, source: str = "canopy") -> tuple[float, int]:
    t0 = time.perf_counter()
    q = (spark.readStream.format(source).option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest").load()
         .writeStream.format("noop").option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    dt = time.perf_counter() - t0
    return dt, sum(p.numInputRows for p in q.recentProgress)


def best_of(spark, bootstrap: str, source: str, a: argparse.Namespace, tmp: str) -> tuple[float, float]:
    """(batch, stream) seconds of `source` reading the bench topic, each the best of
    a.repeat reads; every stream must have seen every record."""
    batch = min(spark_batch(spark, bootstrap, "bench", source) for _ in range(a.repeat))
    streams = []
    for i in range(a.repeat):
        dt, rows = spark_stream(spark, bootstrap, "bench", os.path.join(tmp, f"{source}-ck{i}"), source)
        assert rows == a.records, rows
        streams.append(dt)
    return batch, min(streams)


def floor_source(records: int, size: int, partitions: int):
    """The `canopy_floor` data source (see the module doc). Made in a function so that
    pyspark pickles the classes by value: the Python workers cannot import bench/."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

    from canopy_spark.source import kafka_schema

    class Rows(InputPartition):
        def __init__(self, partition: int, start: int, until: int):
            super().__init__((partition, start, until))
            self.partition, self.start, self.until = partition, start, until

    def ranges(start: int, until: int) -> list:
        # [start, until) of the whole "topic", shared over the partitions like offsets
        per = -(-records // partitions)
        out = []
        for p in range(partitions):
            lo, hi = max(start, p * per), min(until, (p + 1) * per)
            if lo < hi:
                out.append(Rows(p, lo, hi))
        return out

    def read(part: Rows):
        import pyarrow as pa

        value = pa.scalar(os.urandom(size), pa.binary())
        ts = pa.scalar(int(time.time() * 1e6), pa.timestamp("us", tz="UTC"))
        for lo in range(part.start, part.until, 10_000):
            n = min(10_000, part.until - lo)
            yield pa.RecordBatch.from_arrays([
                pa.nulls(n, pa.binary()), pa.repeat(value, n), pa.repeat(pa.scalar("bench", pa.string()), n),
                pa.repeat(pa.scalar(part.partition, pa.int32()), n), pa.array(range(lo, lo + n), pa.int64()),
                pa.repeat(ts, n), pa.repeat(pa.scalar(0, pa.int32()), n),
            ], names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"])

    class Batch(DataSourceReader):
        def partitions(self):
            return ranges(0, records)

        def read(self, partition):
            return read(partition)

    class Stream(DataSourceStreamReader):
        def initialOffset(self):
            return {"offset": 0}

        def latestOffset(self, start=None, limit=None):
            return {"offset": records}

        def partitions(self, start, end):
            return ranges(start["offset"], end["offset"])

        def read(self, partition):
            return read(partition)

    class Floor(DataSource):
        @classmethod
        def name(cls):
            return "canopy_floor"

        def schema(self):
            return kafka_schema(False)

        def reader(self, schema):
            return Batch()

        def streamReader(self, schema):
            return Stream()

    return Floor


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="best of N reads per reader")
    a = ap.parse_args(argv)

    from pipelines.click_counts import spark_session

    load_before = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="canopy-spark-bench-")
    port = free_port()
    broker = start_broker(os.path.join(tmp, "data"), port)
    bootstrap = f"127.0.0.1:{port}"
    try:
        produce(bootstrap, "warmup", 2000, a.size, a.partitions)
        t = time.perf_counter()
        produce(bootstrap, "bench", a.records, a.size, a.partitions)
        print(f"produced {a.records} x {a.size} B in {time.perf_counter() - t:.1f} s")
        spark = spark_session("canopy-spark-bench")
        spark_batch(spark, bootstrap, "warmup")
        results = {}
        results["confluent"] = min(confluent_read(bootstrap, "bench", a.records, a.partitions)
                                   for _ in range(a.repeat))
        results["spark batch"], results["spark stream"] = best_of(spark, bootstrap, "canopy", a, tmp)
        spark.dataSource.register(floor_source(a.records, a.size, a.partitions))
        spark_batch(spark, bootstrap, "bench", "canopy_floor")   # its own warm-up
        results["floor batch"], results["floor stream"] = best_of(spark, bootstrap, "canopy_floor", a, tmp)
        spark.stop()
    finally:
        broker.terminate()
        broker.wait(10)
        # The broker's data directory and the streams' checkpoints are of no use once the
        # figures are taken (until 2026-11-28 every run left its checkpoints in $TMPDIR).
        shutil.rmtree(tmp, ignore_errors=True)

    load = (load_before, os.getloadavg()[0])
    base = a.records / results["confluent"]
    print(f"\n{a.records} records x {a.size} B, {a.partitions} partitions, local[2], "
          f"load average {load[0]:.1f} -> {load[1]:.1f}")
    print(f"{'reader':<14}{'seconds':>9}{'records/s':>12}{'MB/s':>8}{'ratio':>8}")
    out = {"records": a.records, "size": a.size, "partitions": a.partitions,
           "load_average": load, "readers": {}}
    for name, dt in results.items():
        rps = a.records / dt
        print(f"{name:<14}{dt:>9.2f}{rps:>12,.0f}{rps * a.size / 1e6:>8.1f}{rps / base:>8.2f}")
        out["readers"][name] = {"seconds": dt, "records_per_s": rps, "ratio_to_confluent": rps / base}
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    path = res / f"spark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
