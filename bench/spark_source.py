"""Records/s through the `canopy` PySpark source vs a plain confluent-kafka consumer.

    .venv/bin/python bench/spark_source.py [--records 200000] [--size 1024] [--partitions 2]

Starts `canopy serve` on a free loopback port with a temporary data directory, produces
N records of SIZE random bytes over P partitions once, then reads them all back:

  confluent   one Consumer assign()ed to every partition, consume(10000) until N records
              (no per-record Python work beyond the loop) — the reference;
  spark batch spark.read.format("canopy") -> write.format("noop") on local[2]: every row
              goes through the executors' Python read, Arrow, and into the JVM;
  spark stream readStream.format("canopy") availableNow -> noop sink (one micro-batch).

Spark start-up and a warm-up read (Python workers, JIT) are excluded. Printed as a table
with the 1-minute load average before and after (the readers share 2 vCPUs with whatever
else runs, so only ratios from one run compare) and written to
bench/results/spark-<timestamp>.json; the ratio is spark ÷ confluent.
"""
from __future__ import annotations

import argparse
import json
import os
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


def spark_batch(spark, bootstrap: str, topic: str) -> float:
    t0 = time.perf_counter()
    (spark.read.format("canopy").option("kafka.bootstrap.servers", bootstrap)
     .option("subscribe", topic).load().write.format("noop").mode("overwrite").save())
    return time.perf_counter() - t0


def spark_stream(spark, bootstrap: str, topic: str, ck: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    q = (spark.readStream.format("canopy").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("startingOffsets", "earliest").load()
         .writeStream.format("noop").option("checkpointLocation", ck)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    dt = time.perf_counter() - t0
    return dt, sum(p.numInputRows for p in q.recentProgress)


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
        results["spark batch"] = min(spark_batch(spark, bootstrap, "bench") for _ in range(a.repeat))
        stream_times = []
        for i in range(a.repeat):
            dt, rows = spark_stream(spark, bootstrap, "bench", os.path.join(tmp, f"ck{i}"))
            assert rows == a.records, rows
            stream_times.append(dt)
        results["spark stream"] = min(stream_times)
        spark.stop()
    finally:
        broker.terminate()
        broker.wait(10)

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
