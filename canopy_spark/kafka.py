"""The Kafka side of the canopy PySpark source: option parsing, the driver's offset
reader and the executors' range reader, on confluent-kafka (librdkafka).

Why confluent-kafka rather than kafka-python: the executors' read loop is the hot path
and librdkafka decodes record batches in C (kafka-python decodes each record in Python,
several times slower). The driver only issues Metadata and ListOffsets, for which either
would do; using one client keeps one set of configuration semantics.

Option names and offset JSON follow Spark's Kafka source (KafkaSourceProvider,
KafkaSourceOffset, JsonUtils) so a pipeline moves between `format("kafka")` and
`format("canopy")` by changing that one word:

    {"topic": {"0": 23, "1": -2}}   -2 = earliest, -1 = latest (startingOffsets/endingOffsets)
"""
from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator

EARLIEST = -2
LATEST = -1

# Options that only make sense for Java's client (Spark rejects or overrides them too).
_JAVA_ONLY = {"key.deserializer", "value.deserializer", "key.serializer", "value.serializer",
              "auto.offset.reset", "enable.auto.commit", "interceptor.classes"}


class DataLossError(RuntimeError):
    """Raised when failOnDataLoss=true and offsets Spark asked for are gone (retention,
    DeleteRecords, a deleted topic) — Spark's own source raises IllegalStateException."""


def lower_options(options) -> dict[str, str]:
    # Spark's option maps are case-insensitive; pyspark hands us a CaseInsensitiveDict,
    # but normalise so plain dicts behave the same.
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def client_config(options: dict[str, str]) -> dict[str, str]:
    """`kafka.*` options, prefix stripped, as librdkafka configuration."""
    conf = {}
    for k, v in options.items():
        if k.startswith("kafka."):
            key = k[len("kafka."):]
            if key not in _JAVA_ONLY:
                conf[key] = v
    if "bootstrap.servers" not in conf:
        raise ValueError("option 'kafka.bootstrap.servers' must be specified")
    return conf


def parse_bool(v: str | None, default: bool) -> bool:
    if v is None:
        return default
    return v.strip().lower() == "true"


@dataclass(frozen=True)
class Subscription:
    """Exactly one of subscribe / subscribePattern / assign, as Spark requires."""
    kind: str            # "subscribe" | "subscribepattern" | "assign"
    value: object        # list of topics | compiled pattern | {topic: [partitions]}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "Subscription":
        given = [k for k in ("subscribe", "subscribepattern", "assign") if k in options]
        if len(given) != 1:
            raise ValueError("exactly one of the options 'subscribe', 'subscribePattern', "
                             f"'assign' must be specified, got {given or 'none'}")
        kind = given[0]
        raw = options[kind]
        if kind == "subscribe":
            topics = [t.strip() for t in raw.split(",") if t.strip()]
            if not topics:
                raise ValueError("no topics to subscribe to")
            return cls(kind, topics)
        if kind == "subscribepattern":
            return cls(kind, re.compile(raw.strip()))
        parsed = json.loads(raw)
        return cls(kind, {t: [int(p) for p in ps] for t, ps in parsed.items()})


def parse_offsets_json(raw: str) -> dict[str, dict[int, int]]:
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(raw).items()}


def to_offsets_json(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """Spark's KafkaSourceOffset JSON: {"topic": {"partition": offset}} with string keys."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def from_offsets_json(d: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in d.items() for p, o in parts.items()}


class OffsetReader:
    """The driver's view of the topics: mirrors Spark's KafkaOffsetReaderAdmin (partitions of
    the subscribed topics; earliest / latest / for-timestamp offsets per partition)."""

    def __init__(self, options: dict[str, str]):
        from confluent_kafka import Consumer

        self.options = options
        self.subscription = Subscription.from_options(options)
        conf = client_config(options)
        conf.update({
            # Spark's driver uses "spark-kafka-source-<uuid>-driver-0"; never joins a group.
            "group.id": f"canopy-spark-{uuid.uuid4()}-driver",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        })
        self.consumer = Consumer(conf)
        self.timeout = float(options.get("kafkaconsumer.metadatatimeoutsec", "30"))

    def close(self) -> None:
        self.consumer.close()

    def partitions(self) -> list[tuple[str, int]]:
        sub = self.subscription
        if sub.kind == "assign":
            return sorted((t, p) for t, ps in sub.value.items() for p in ps)
        md = self.consumer.list_topics(timeout=self.timeout)
        if sub.kind == "subscribe":
            names = [t for t in sub.value if t in md.topics]
        else:
            # Spark 4's SubscribePatternStrategy keeps a topic when the regex is *found* in
            # its name (Regex.findFirstIn, not a whole-name match); Admin.listTopics() leaves
            # internal topics out.
            names = [t for t in md.topics if sub.value.search(t) and not t.startswith("__")]
        out = []
        for t in names:
            tm = md.topics[t]
            if tm.error is not None:
                continue
            out.extend((t, p) for p in tm.partitions)
        return sorted(out)

    def watermarks(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        from confluent_kafka import TopicPartition

        out = {}
        for t, p in tps:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(t, p), timeout=self.timeout, cached=False)
            out[(t, p)] = (low, high)
        return out

    def earliest(self, tps) -> dict[tuple[str, int], int]:
        return {tp: lh[0] for tp, lh in self.watermarks(tps).items()}

    def latest(self, tps) -> dict[tuple[str, int], int]:
        return {tp: lh[1] for tp, lh in self.watermarks(tps).items()}

    def for_timestamps(self, ts_by_tp: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """ListOffsets by timestamp: the first offset whose timestamp >= ts, or -1 if none."""
        from confluent_kafka import TopicPartition

        if not ts_by_tp:
            return {}
        req = [TopicPartition(t, p, ts) for (t, p), ts in ts_by_tp.items()]
        res = self.consumer.offsets_for_times(req, timeout=self.timeout)
        out = {}
        for r in res:
            if r.error is not None:
                raise RuntimeError(f"offsets_for_times {r.topic}/{r.partition}: {r.error}")
            out[(r.topic, r.partition)] = r.offset if r.offset >= 0 else -1
        return out

    def resolve(self, which: str, tps: list[tuple[str, int]], default: str) -> dict[tuple[str, int], int]:
        """Resolve startingOffsets* / endingOffsets* (which = "starting" | "ending") the way
        KafkaSourceProvider.getKafkaOffsetRangeLimit does: by-timestamp options first, then
        the offsets option ("earliest", "latest" or JSON), else `default`."""
        o = self.options
        starting = which == "starting"
        if f"{which}offsetsbytimestamp" in o or f"{which}timestamp" in o:
            if f"{which}timestamp" in o:
                ts = int(o[f"{which}timestamp"])
                want = {tp: ts for tp in tps}
            else:
                spec = parse_offsets_json(o[f"{which}offsetsbytimestamp"])
                want = {(t, p): ts for t, parts in spec.items() for p, ts in parts.items()}
                missing = set(tps) - set(want)
                if missing:
                    raise ValueError(f"{which}OffsetsByTimestamp lacks partitions {sorted(missing)}")
            found = self.for_timestamps(want)
            latest = None
            out = {}
            for tp, off in found.items():
                if off < 0:
                    # No record at or after the timestamp. Ending: read to the end (Spark maps
                    # -1 to latest). Starting: Spark's startingOffsetsByTimestampStrategy —
                    # "error" (default) fails, "latest" starts at the end.
                    strategy = o.get("startingoffsetsbytimestampstrategy", "error").lower()
                    if starting and strategy == "error":
                        raise ValueError(
                            f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} "
                            f"and timestamp {want[tp]}.")
                    if latest is None:
                        latest = self.latest(tps)
                    off = latest[tp]
                out[tp] = off
            return out
        spec = o.get(f"{which}offsets", default).strip()
        if spec.lower() == "earliest":
            if not starting:
                raise ValueError("endingOffsets cannot be 'earliest'")
            return self.earliest(tps)
        if spec.lower() == "latest":
            return self.latest(tps)
        given = parse_offsets_json(spec)
        wanted = {(t, p): off for t, parts in given.items() for p, off in parts.items()}
        missing = set(tps) - set(wanted)
        if missing and self.subscription.kind != "subscribepattern":
            raise ValueError(f"{which}Offsets lacks partitions {sorted(missing)}")
        out = {}
        need_e = [tp for tp in tps if wanted.get(tp, EARLIEST) == EARLIEST]
        need_l = [tp for tp in tps if wanted.get(tp) == LATEST]
        e = self.earliest(need_e) if need_e else {}
        l_ = self.latest(need_l) if need_l else {}
        for tp in tps:
            off = wanted.get(tp, EARLIEST)
            out[tp] = e[tp] if off == EARLIEST else l_[tp] if off == LATEST else off
        return out


# ------------------------------------------------------------------ executors

def executor_consumer(conf: dict[str, str]):
    """A consumer set up like Spark's executors' (KafkaSourceProvider.kafkaParamsForExecutors):
    assign only, group "<uuid>-executor" never joined, no commits, auto.offset.reset none
    (librdkafka: 'error') so a vanished offset is reported, never silently skipped."""
    from confluent_kafka import Consumer

    c = dict(conf)
    # Once a partition's local queue holds queued.max.messages.kbytes (64 MiB), librdkafka
    # stops fetching it and looks again only after fetch.queue.backoff.ms (1 s). A task
    # reading a larger range drains the queue well within that second and then waits for
    # the rest. Spark's Java consumer fetches as soon as its buffer is drained; 10 ms comes
    # close (a kafka.fetch.queue.backoff.ms option still wins).
    c.setdefault("fetch.queue.backoff.ms", "10")
    c.update({
        "group.id": f"canopy-spark-{uuid.uuid4()}-executor",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        # The end of the partition tells a range ending in a compacted gap from a slow fetch.
        "enable.partition.eof": True,
    })
    return Consumer(c)


def _contiguous(msgs: list, first: int) -> bool:
    """True when msgs are exactly the records first, first+1, ... and carry no error (an
    error event such as the end of the partition has the offset after the last record, so
    it would break the count). Offsets only increase within a partition, so the first and
    last offsets and the length settle it."""
    last = msgs[-1]
    return (last.error() is None and msgs[0].error() is None
            and msgs[0].offset() == first and last.offset() == first + len(msgs) - 1
            and all(m.error() is None for m in msgs))


def read_range(conf: dict[str, str], topic: str, partition: int, start: int, until: int,
               fail_on_data_loss: bool, poll_timeout_s: float = 120.0,
               chunk: int = 10_000) -> Iterator[list]:
    """Yield lists of confluent_kafka Messages covering offsets [start, until) of one
    partition, in order. Offsets missing below `until` (retention, DeleteRecords) raise
    DataLossError when fail_on_data_loss, else are skipped — Spark's KafkaDataConsumer.get.
    Offsets with no record inside the log (a compacted topic's gaps) are skipped, as Spark
    skips them."""
    from confluent_kafka import KafkaError, TopicPartition

    if start >= until:
        return
    consumer = executor_consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        next_offset = start
        deadline = time.monotonic() + poll_timeout_s
        while next_offset < until:
            # consume() returns when it holds num_messages or the timeout has passed: asked
            # for more records than the range has left, the last call of every range (and
            # the only call of a small micro-batch) would sit out the whole timeout.
            msgs = consumer.consume(num_messages=min(chunk, until - next_offset), timeout=0.5)
            if msgs and _contiguous(msgs, next_offset):
                # The common case: records next_offset, next_offset+1, ... with no error
                # among them; hand them on without looking at each one again.
                take = min(len(msgs), until - next_offset)
                next_offset += take
                deadline = time.monotonic() + poll_timeout_s
                yield msgs if take == len(msgs) else msgs[:take]
                continue
            batch = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._AUTO_OFFSET_RESET or err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=30, cached=False)
                        if fail_on_data_loss:
                            raise DataLossError(
                                f"Cannot fetch offset {next_offset} of {topic}-{partition}: "
                                f"the log now starts at {low} (retention or DeleteRecords). "
                                "Some data may have been lost; set failOnDataLoss=false to skip.")
                        if low >= until:
                            return
                        next_offset = max(low, next_offset)
                        consumer.assign([TopicPartition(topic, partition, next_offset)])
                        break
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= until:
                            # [next_offset, until) holds no record any more: a compacted
                            # topic's cleaner removed them (Spark: invisible offsets)
                            next_offset = until
                            break
                        continue
                    raise RuntimeError(f"consume {topic}-{partition}: {err}")
                off = m.offset()
                if off >= until:
                    next_offset = until
                    break
                if off > next_offset and fail_on_data_loss:
                    # A gap at or above the log start is compaction (invisible offsets, which
                    # Spark's KafkaDataConsumer skips); below it, retention took them: loss.
                    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                    if low > next_offset:
                        raise DataLossError(f"{topic}-{partition}: expected offset {next_offset}, "
                                            f"got {off}; records were lost")
                batch.append(m)
                next_offset = off + 1
            if batch:
                deadline = time.monotonic() + poll_timeout_s
                yield batch
            elif next_offset < until and time.monotonic() > deadline:
                raise TimeoutError(f"Cannot fetch record for offset {next_offset} of "
                                   f"{topic}-{partition} in {poll_timeout_s} s")
    finally:
        consumer.close()
