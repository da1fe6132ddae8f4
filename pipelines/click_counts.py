"""Structured Streaming job: clicks per page per one-minute event-time window.

    python -m pipelines.click_counts --bootstrap 127.0.0.1:9092 --input clicks \
        --output click-counts --parquet out/click_counts --checkpoint out/checkpoint

Reads JSON click events from canopy with the `canopy` PySpark source (the same options as
Spark's `kafka` source: swap the format name to run it on Spark's own connector), parses
them, counts clicks per page per one-minute tumbling window of event time with a
watermark, and in append mode emits each window once, when the watermark has passed its
end (so a count is final when it is written). Each micro-batch's counts go to

  * Parquet under <parquet>/batch_id=<n>/ (overwritten if Spark replays batch n after a
    crash, so the directory holds every window exactly once), and
  * the <output> topic as JSON, key = page (Spark's Kafka sink semantics: at-least-once).

The checkpoint records the source offsets of every micro-batch: a restarted job resumes
after the last committed one.
"""
from __future__ import annotations

import argparse
import os
import sys

WATERMARK_DELAY = "1 minute"
WINDOW = "1 minute"


def spark_session(app: str = "canopy-click-counts", master: str = "local[2]"):
    """A lean local session: 2 shuffle partitions, no UI (this machine has 2 vCPUs)."""
    if not os.environ.get("JAVA_HOME"):
        for cand in ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/default-java"):
            if os.path.isdir(cand):
                os.environ["JAVA_HOME"] = cand
                break
    # Workers run this interpreter through pipelines/spark_python.sh, which keeps Spark's
    # pyspark.zip off their path when it duplicates the installed pyspark (a zip has no
    # bytecode: every streaming query's freshly started source runner would compile pyspark).
    os.environ.setdefault("CANOPY_SPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_PYTHON", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "spark_python.sh"))
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Spark binds its driver to the address the host name resolves to, or warns that it
    # "resolves to a loopback address" and picks the first external interface. A local
    # session has no reason to listen beyond loopback (and tests may talk only to
    # 127.0.0.0/8): pin the driver there.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import canopy_spark

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    canopy_spark.register(spark)
    return spark


def click_counts(spark, bootstrap: str, input_topic: str, source_format: str = "canopy",
                 starting_offsets: str = "earliest", max_offsets_per_trigger: int | None = None):
    """The streaming DataFrame of final (window, page, clicks) rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    click = StructType([
        StructField("user", StringType()),
        StructField("page", StringType()),
        StructField("event_time", TimestampType()),
    ])
    reader = (spark.readStream.format(source_format)
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", input_topic)
              .option("startingOffsets", starting_offsets))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    raw = reader.load()
    events = (raw.select(F.from_json(F.col("value").cast("string"), click).alias("e"))
              .select("e.*")
              .where(F.col("page").isNotNull() & F.col("event_time").isNotNull()))
    return (events.withWatermark("event_time", WATERMARK_DELAY)
            .groupBy(F.window("event_time", WINDOW).alias("window"), "page")
            .count()
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"),
                    "page", F.col("count").alias("clicks")))


def start(spark, bootstrap: str, input_topic: str, output_topic: str, parquet_dir: str,
          checkpoint: str, available_now: bool = True, max_offsets_per_trigger: int | None = None,
          source_format: str = "canopy"):
    from pyspark.sql import functions as F

    counts = click_counts(spark, bootstrap, input_topic, source_format,
                          max_offsets_per_trigger=max_offsets_per_trigger)

    def write_batch(df, batch_id: int) -> None:
        df = df.persist()
        try:
            # Idempotent per batch id: a replayed batch overwrites its own directory.
            df.write.mode("overwrite").parquet(os.path.join(parquet_dir, f"batch_id={batch_id}"))
            (df.select(F.col("page").alias("key"),
                       F.to_json(F.struct("window_start", "window_end", "page", "clicks")).alias("value"))
               .write.format(source_format)
               .option("kafka.bootstrap.servers", bootstrap)
               .option("topic", output_topic)
               .mode("append").save())
        finally:
            df.unpersist()

    writer = (counts.writeStream.outputMode("append")
              .foreachBatch(write_batch)
              .option("checkpointLocation", checkpoint)
              .queryName("click_counts"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="5 seconds")
    return writer.start()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--input", default="clicks")
    ap.add_argument("--output", default="click-counts")
    ap.add_argument("--parquet", default="out/click_counts")
    ap.add_argument("--checkpoint", default="out/checkpoint")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None)
    ap.add_argument("--continuous", action="store_true",
                    help="keep running (5 s processing-time trigger) instead of availableNow")
    a = ap.parse_args(argv)
    spark = spark_session()
    q = start(spark, a.bootstrap, a.input, a.output, a.parquet, a.checkpoint,
              available_now=not a.continuous, max_offsets_per_trigger=a.max_offsets_per_trigger)
    q.awaitTermination()
    rows = (spark.read.parquet(a.parquet).orderBy("window_start", "page").collect()
            if os.path.isdir(a.parquet) else [])
    print(f"{len(rows)} final (window, page) counts in {a.parquet}; "
          f"{sum(r.clicks for r in rows)} clicks; also in topic {a.output}")
    for r in rows[:12]:
        print(f"  {r.window_start:%Y-%m-%d %H:%M} {r.page:<8} {r.clicks}")
    spark.stop()


if __name__ == "__main__":
    main()
