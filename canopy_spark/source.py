"""`format("canopy")`: Spark's Kafka source and sink, rebuilt on the Python Data Source API
(pyspark >= 4.0) so it runs without the spark-sql-kafka jar.

Same schema and option names as Spark's Kafka source (see docs/spark.md):
  batch     spark.read.format("canopy")  startingOffsets(ByTimestamp)/startingTimestamp,
            endingOffsets(ByTimestamp)/endingTimestamp
  streaming spark.readStream.format("canopy")  one input partition per Kafka partition per
            micro-batch; offsets are Spark-style JSON that Spark checkpoints, so a restarted
            query resumes exactly where the last committed micro-batch ended
  sink      df.write / writeStream .format("canopy")  topic option or `topic` column,
            key/value (string or binary), optional partition and headers columns; an
            idempotent acks=all producer (Spark's sink: at-least-once)
"""
from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from . import kafka as K

try:  # pyspark >= 4.2: admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

HEADERS_TYPE = ArrayType(StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
]))


def kafka_schema(include_headers: bool) -> StructType:
    """Spark's KafkaRecordToRowConverter.kafkaSchema."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


class CanopyDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "canopy"

    def __init__(self, options):
        super().__init__(options)
        self.opts = K.lower_options(options)

    def schema(self):
        return kafka_schema(K.parse_bool(self.opts.get("includeheaders"), False))

    def reader(self, schema):
        return CanopyBatchReader(self.opts)

    def streamReader(self, schema):
        return CanopyStreamReader(self.opts)

    def writer(self, schema, overwrite):
        return CanopyWriter(self.opts, schema)

    def streamWriter(self, schema, overwrite):
        return CanopyStreamWriter(self.opts, schema)


class OffsetRange(InputPartition):
    """One Kafka partition's [start, until) — Spark's KafkaOffsetRange."""

    def __init__(self, topic: str, partition: int, start: int, until: int):
        super().__init__((topic, partition, start, until))
        self.topic, self.partition, self.start, self.until = topic, partition, start, until

    def __repr__(self):
        return f"OffsetRange({self.topic}-{self.partition} [{self.start}, {self.until}))"


# ------------------------------------------------------------------ reading

def _arrow_schema(include_headers: bool):
    import pyarrow as pa

    fields = [
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
    return pa.schema(fields)


def read_partition(opts: dict[str, str], part: OffsetRange) -> Iterator:
    """Executor side: read one offset range and yield Arrow record batches (building columns
    in Arrow skips Spark's per-row tuple conversion, the costliest step of a Python source)."""
    import pyarrow as pa

    include_headers = K.parse_bool(opts.get("includeheaders"), False)
    schema = _arrow_schema(include_headers)
    conf = K.client_config(opts)
    fail = K.parse_bool(opts.get("failondataloss"), True)
    timeout_s = float(opts.get("kafkaconsumer.polltimeoutms", "120000")) / 1000.0
    ts_type = pa.timestamp("us", tz="UTC")
    topic_col = pa.scalar(part.topic, pa.string())
    partition_col = pa.scalar(part.partition, pa.int32())
    for msgs in K.read_range(conf, part.topic, part.partition, part.start, part.until, fail, timeout_s):
        n = len(msgs)
        # One comprehension per column: this is the source's per-record cost, and a
        # comprehension per attribute runs well ahead of one loop appending to five lists.
        stamps = [m.timestamp() for m in msgs]
        cols = [
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            pa.repeat(topic_col, n),
            pa.repeat(partition_col, n),
            pa.array([m.offset() for m in msgs], pa.int64()),
            pa.array([t * 1000 if t >= 0 else None for _, t in stamps], ts_type),
            # librdkafka: 1 CreateTime, 2 LogAppendTime; Kafka's TimestampType.id: 0, 1.
            pa.array([1 if kind == 2 else 0 for kind, _ in stamps], pa.int32()),
        ]
        if include_headers:
            hs = []
            for m in msgs:
                h = m.headers()
                hs.append([{"key": k, "value": v} for k, v in h] if h else [])
            cols.append(pa.array(hs, schema.field("headers").type))
        yield pa.RecordBatch.from_arrays(cols, schema=schema)


def _ranges(start: dict, end: dict) -> list[OffsetRange]:
    parts = []
    for (t, p), until in sorted(end.items()):
        frm = start[(t, p)]
        if until > frm:
            parts.append(OffsetRange(t, p, frm, until))
    return parts


class CanopyBatchReader(DataSourceReader):
    def __init__(self, opts: dict[str, str]):
        self.opts = opts  # maxOffsetsPerTrigger is accepted and ignored, as in Spark

    def partitions(self):
        reader = K.OffsetReader(self.opts)
        try:
            tps = reader.partitions()
            start = reader.resolve("starting", tps, "earliest")
            end = reader.resolve("ending", tps, "latest")
        finally:
            reader.close()
        ranges = _ranges(start, end)
        # Spark needs at least one partition to plan a scan.
        return ranges or [OffsetRange("", -1, 0, 0)]

    def read(self, partition: OffsetRange):
        if partition.partition < 0:
            return iter(())
        return read_partition(self.opts, partition)


class CanopyStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Lives in a long-lived Python worker on the driver; Spark writes the
    dict returned by latestOffset to the checkpoint's offsets log before planning the batch,
    and hands it back as `start` of the next batch (also after a restart)."""

    def __init__(self, opts: dict[str, str]):
        self.opts = opts
        for k in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp"):
            if k in opts:
                raise ValueError(f"option '{k}' is for batch queries only (as in Spark)")
        self._reader = None
        self.max_per_trigger = int(opts["maxoffsetspertrigger"]) if "maxoffsetspertrigger" in opts else None
        self.fail_on_data_loss = K.parse_bool(opts.get("failondataloss"), True)
        self.available_now_target = None
        self._initial = None      # initialOffset, resolved once (Spark: initialPartitionOffsets)
        self._last_latest = None  # what the last latestOffset saw, for reportLatestOffset

    @property
    def reader(self) -> K.OffsetReader:
        if self._reader is None:
            self._reader = K.OffsetReader(self.opts)
        return self._reader

    def initialOffset(self) -> dict:
        # Spark asks more than once before batch 0 is logged; resolving again would cost
        # round trips and, with startingOffsets=latest, could answer differently each time.
        if self._initial is None:
            r = self.reader
            self._initial = K.to_offsets_json(r.resolve("starting", r.partitions(), "latest"))
        return self._initial

    def getDefaultReadLimit(self):
        if self.max_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        r = self.reader
        self.available_now_target = r.latest(r.partitions())

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        r = self.reader
        if self.available_now_target is not None:
            latest = dict(self.available_now_target)
        else:
            latest = r.latest(r.partitions())
        self._last_latest = dict(latest)
        if start is None:  # pyspark 4.0/4.1: no admission control
            return K.to_offsets_json(latest)
        begin = K.from_offsets_json(start)
        new = [tp for tp in latest if tp not in begin]
        if new:  # rate-limit new partitions from their log start (see partitions())
            begin.update(r.earliest(new))
        for tp, off in begin.items():
            if tp not in latest and self.fail_on_data_loss:
                raise K.DataLossError(f"partition {tp[0]}-{tp[1]} is gone (topic deleted?)")
        max_rows = getattr(limit, "max_rows", None)
        if max_rows is None and limit is None:
            max_rows = self.max_per_trigger
        if max_rows is not None:
            latest = self._rate_limit(begin, latest, max_rows)
        # Never go backwards (Spark treats a smaller end as data loss).
        for tp, off in begin.items():
            if tp in latest and latest[tp] < off:
                if self.fail_on_data_loss:
                    raise K.DataLossError(f"{tp[0]}-{tp[1]}: latest offset {latest[tp]} is below "
                                          f"the checkpointed {off}")
                latest[tp] = off
        return K.to_offsets_json(latest)

    @staticmethod
    def _rate_limit(begin: dict, latest: dict, max_rows: int) -> dict:
        """KafkaMicroBatchStream.rateLimit: share maxOffsetsPerTrigger between partitions in
        proportion to their lag."""
        lag = {tp: max(0, off - begin.get(tp, 0)) for tp, off in latest.items()}
        total = sum(lag.values())
        if total <= max_rows:
            return latest
        out = {}
        given = 0
        for tp in sorted(latest):
            share = int(max_rows * lag[tp] / total)
            out[tp] = begin.get(tp, 0) + share
            given += share
        # hand out the rounding remainder so each batch makes progress
        for tp in sorted(latest):
            if given >= max_rows:
                break
            if out[tp] < latest[tp]:
                out[tp] += 1
                given += 1
        return out

    def reportLatestOffset(self):
        # Spark calls this right after latestOffset, for the progress report; like Spark's
        # KafkaMicroBatchStream it reports the offsets that call saw (under availableNow, the
        # target) rather than asking the broker a second time.
        if self._last_latest is not None:
            return K.to_offsets_json(self._last_latest)
        r = self.reader
        return K.to_offsets_json(r.latest(r.partitions()))

    def partitions(self, start: dict, end: dict):
        begin, until = K.from_offsets_json(start), K.from_offsets_json(end)
        new = [tp for tp in until if tp not in begin]
        if new:
            # Partitions (or pattern-matched topics) that appeared since `start` are read from
            # their log start offset, as Spark's KafkaMicroBatchStream does for new partitions.
            begin.update(self.reader.earliest(new))
        return _ranges(begin, until)

    def read(self, partition: OffsetRange):
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        # Spark's Kafka source commits nothing to Kafka: the checkpoint is the source of truth.
        pass

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


# ------------------------------------------------------------------ writing

class WriteResult(WriterCommitMessage):
    def __init__(self, written: int):
        self.written = written


def producer_config(opts: dict[str, str]) -> dict:
    """Spark's sink producer (KafkaSourceProvider.kafkaParamsForProducer) is kafka-clients'
    default one: idempotent, acks=all. librdkafka needs idempotence asked for explicitly."""
    conf = K.client_config(opts)
    conf.setdefault("enable.idempotence", True)
    conf.setdefault("acks", "all")
    conf.setdefault("linger.ms", 5)
    return conf


def _bytes(v):
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return str(v).encode("utf-8")


def write_rows(opts: dict[str, str], schema: StructType, rows) -> WriteResult:
    """KafkaWriteTask: one record per row; topic from the `topic` option (which wins, as in
    Spark 3.x+) or the row's `topic` column; `value` required, `key`, `partition`,
    `headers` optional; flush at the end and fail the task on the first error."""
    from confluent_kafka import Producer

    names = set(schema.fieldNames())
    if "value" not in names:
        raise ValueError("Required attribute 'value' not found")
    topic_opt = opts.get("topic")
    if topic_opt is None and "topic" not in names:
        raise ValueError("topic option required when no 'topic' attribute is present")
    producer = Producer(producer_config(opts))
    failed: list = []
    written = 0

    def on_delivery(err, msg):
        if err is not None and not failed:
            failed.append(err)

    for row in rows:
        if failed:
            break
        d = row.asDict() if hasattr(row, "asDict") else dict(row)
        topic = topic_opt or d.get("topic")
        if topic is None:
            raise ValueError("null topic present in the data")
        kw = {}
        if "partition" in names and d.get("partition") is not None:
            kw["partition"] = int(d["partition"])
        if "headers" in names and d.get("headers"):
            kw["headers"] = [(h["key"], _bytes(h["value"])) for h in d["headers"]]
        while True:
            try:
                producer.produce(topic, value=_bytes(d["value"]), key=_bytes(d.get("key")),
                                 on_delivery=on_delivery, **kw)
                break
            except BufferError:
                producer.poll(0.1)
        written += 1
        producer.poll(0)
    remaining = producer.flush(120)
    if failed:
        raise RuntimeError(f"writing to canopy failed: {failed[0]}")
    if remaining:
        raise RuntimeError(f"{remaining} records not acknowledged after 120 s")
    return WriteResult(written)


class CanopyWriter(DataSourceWriter):
    def __init__(self, opts, schema):
        self.opts, self.schema = opts, schema

    def write(self, iterator):
        return write_rows(self.opts, self.schema, iterator)


class CanopyStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts, schema):
        self.opts, self.schema = opts, schema

    def write(self, iterator):
        return write_rows(self.opts, self.schema, iterator)

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass
