// SparkLikeClient: drives kafka-clients the way Spark's Kafka connector does, one step per
// subcommand, so the e2e tests can check a broker against the exact calls Spark makes without
// running Spark. Java 17 stdlib + kafka-clients only (compiles against 3.9.1 and 4.3.0).
//
// Spark 4.0 (sql/connector kafka-0-10-sql, kafka-clients 3.9.x) splits the work like this:
//   driver    KafkaOffsetReaderAdmin: Admin.describeTopics + Admin.listOffsets(earliest/latest/
//             forTimestamp) to plan each micro-batch's offset ranges;
//   executors KafkaDataConsumer / InternalKafkaConsumer: a KafkaConsumer per task with
//             group.id "<uuid>-executor", auto.offset.reset=none, no commits,
//             assign(one partition) -> seek(from) -> poll until offset `until`;
//   sink      KafkaWriteTask / CachedKafkaProducer: a default KafkaProducer (idempotent,
//             acks=all since kafka-clients 3.0) with byte-array serializers, flush at the end.
//
// Usage (all output on stdout is line-oriented key=value for the tests to parse;
// diagnostics go to stderr; exit 0 ok, 1 error, 3 timeout / data mismatch):
//   create-topic  <bootstrap> <topic> <partitions>
//   admin-describe <bootstrap> <topic>
//       topic=<t> partitions=<n>
//       partition=<p> leader=<id> replicas=<a,b> isr=<a,b>
//   list-offsets  <bootstrap> <topic> earliest|latest|max-timestamp|<timestamp-ms>[,...] [--read-committed]
//       <p>=<offset>                   (one line per partition; -1 = no record at/after ts)
//       with several comma-separated specs (one Admin, one listOffsets call each, as the
//       driver does across micro-batches) each group is preceded by a line spec=<spec>
//   offset-range  <bootstrap> <topic> <partition>
//       earliest=<o> latest=<o>
//   consume-range <bootstrap> <topic> <partition> <from> <until> [--print] [--timeout-ms N]
//       R <offset> <timestamp> <key-hex|-> <value-hex|-> <n-headers>     (only with --print)
//       count=<n> first=<o> last=<o> crc=<crc32 hex>
//   produce       <bootstrap> <topic> <n> [--partition P] [--ts-base MS --ts-step MS]
//                 [--value-size B] [--headers]
//       acked=<n>
//       partition=<p> min=<o> max=<o> count=<n>
//   list-pattern  <bootstrap> <regex>
//       topic=<t> partitions=<n>       (one line per topic the pattern selects, sorted)
//   delete-records <bootstrap> <topic> <partition> <before-offset>     (test setup, not Spark)
//       low_watermark=<o>
//   spark-get     <bootstrap> <topic> <partition> <from> <until> [--fail-on-data-loss true|false]
//                 [--poll-timeout-ms N]
//       count=<n> first=<o> last=<o> crc=<crc32 hex> skipped=<n> polls=<n>
//       exit 4 with "DATALOSS ..." on stderr when failOnDataLoss=true and offsets are gone
// Any subcommand also takes --prop key=value (repeatable) to override a client config.
//
// crc = CRC32 over, per record in offset order: offset (int64 BE), key length (int32 BE,
// -1 for null) + key bytes, value length (int32 BE, -1 for null) + value bytes.
// tests/e2e/test_java_client.py computes the same over what it expects.

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.zip.CRC32;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class SparkLikeClient {

    static final int EXIT_ERROR = 1;
    static final int EXIT_TIMEOUT = 3;
    static final int EXIT_DATA_LOSS = 4;

    /** Thrown for timeouts and data mismatches: exit code 3, message on stderr. */
    static final class Mismatch extends RuntimeException {
        private static final long serialVersionUID = 1L;
        Mismatch(String msg) { super(msg); }
    }

    public static void main(String[] argv) {
        List<String> args = new ArrayList<>();
        Map<String, String> props = new LinkedHashMap<>();
        Set<String> flags = new HashSet<>();
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (a.equals("--prop")) {
                String kv = argv[++i];
                int eq = kv.indexOf('=');
                props.put(kv.substring(0, eq), kv.substring(eq + 1));
            } else if (a.equals("--print") || a.equals("--headers") || a.equals("--read-committed")) {
                flags.add(a);
            } else if (a.startsWith("--")) {
                opts.put(a, argv[++i]);
            } else {
                args.add(a);
            }
        }
        if (args.isEmpty()) {
            System.err.println("usage: SparkLikeClient <subcommand> ... (see the source header)");
            System.exit(2);
        }
        try {
            String cmd = args.get(0);
            switch (cmd) {
                case "create-topic" -> createTopic(args.get(1), args.get(2), Integer.parseInt(args.get(3)), props);
                case "admin-describe" -> adminDescribe(args.get(1), args.get(2), props);
                case "list-offsets" -> listOffsets(args.get(1), args.get(2), args.get(3),
                        flags.contains("--read-committed"), props);
                case "offset-range" -> offsetRange(args.get(1), args.get(2), Integer.parseInt(args.get(3)), props);
                case "consume-range" -> consumeRange(args.get(1), args.get(2), Integer.parseInt(args.get(3)),
                        Long.parseLong(args.get(4)), Long.parseLong(args.get(5)), flags.contains("--print"),
                        Long.parseLong(opts.getOrDefault("--timeout-ms", "60000")), props);
                case "produce" -> produce(args.get(1), args.get(2), Integer.parseInt(args.get(3)),
                        opts.containsKey("--partition") ? Integer.valueOf(opts.get("--partition")) : null,
                        opts.containsKey("--ts-base") ? Long.valueOf(opts.get("--ts-base")) : null,
                        Long.parseLong(opts.getOrDefault("--ts-step", "1")),
                        Integer.parseInt(opts.getOrDefault("--value-size", "100")),
                        flags.contains("--headers"), props);
                case "list-pattern" -> listPattern(args.get(1), args.get(2), props);
                case "delete-records" -> deleteRecords(args.get(1), args.get(2), Integer.parseInt(args.get(3)),
                        Long.parseLong(args.get(4)), props);
                case "spark-get" -> sparkGet(args.get(1), args.get(2), Integer.parseInt(args.get(3)),
                        Long.parseLong(args.get(4)), Long.parseLong(args.get(5)),
                        Boolean.parseBoolean(opts.getOrDefault("--fail-on-data-loss", "true")),
                        Long.parseLong(opts.getOrDefault("--poll-timeout-ms", "120000")), props);
                default -> {
                    System.err.println("unknown subcommand " + cmd);
                    System.exit(2);
                }
            }
        } catch (DataLoss e) {
            System.out.flush();
            System.err.println("DATALOSS " + e.getMessage()
                    + (e.getCause() == null ? "" : " cause=" + e.getCause().getClass().getName()));
            System.exit(EXIT_DATA_LOSS);
        } catch (Mismatch e) {
            System.out.flush();
            System.err.println("MISMATCH " + e.getMessage());
            System.exit(EXIT_TIMEOUT);
        } catch (Throwable e) {
            Throwable root = (e instanceof ExecutionException && e.getCause() != null) ? e.getCause() : e;
            System.out.flush();
            System.err.println("ERROR " + root.getClass().getName() + ": " + root.getMessage());
            root.printStackTrace(System.err);
            System.exit(EXIT_ERROR);
        }
        System.out.flush();
        // Exit explicitly: client threads (e.g. the producer's) must not keep the JVM alive.
        System.exit(0);
    }

    // ---------------------------------------------------------------- driver (Admin)

    /**
     * The Admin config Spark's driver uses: ConsumerStrategy.createAdmin(kafkaParams) passes
     * KafkaSourceProvider.kafkaParamsForDriver straight to Admin.create, consumer-only keys
     * included (Admin logs them as unknown and ignores them).
     */
    static Properties driverParams(String bootstrap, Map<String, String> overrides) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        // KafkaSourceProvider.kafkaParamsForDriver
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1");
        p.put(ConsumerConfig.RECEIVE_BUFFER_CONFIG, "65536");
        p.putAll(overrides);
        return p;
    }

    /** Not a Spark step (Spark expects topics to exist); lets tests pick a partition count. */
    static void createTopic(String bootstrap, String topic, int partitions, Map<String, String> props)
            throws Exception {
        try (Admin admin = Admin.create(driverParams(bootstrap, props))) {
            admin.createTopics(List.of(new NewTopic(topic, Optional.of(partitions), Optional.empty())))
                    .all().get();
        }
        System.out.println("created=" + topic + " partitions=" + partitions);
    }

    /**
     * Mirrors SubscribeStrategy.assignedTopicPartitions(admin) -> ConsumerStrategy
     * .retrieveAllPartitions: admin.describeTopics(topics).allTopicNames().get(), then the
     * partitions of each TopicDescription become the driver's TopicPartition set.
     */
    static Map<String, TopicDescription> describe(Admin admin, String topic) throws Exception {
        return admin.describeTopics(List.of(topic)).allTopicNames().get();
    }

    static void adminDescribe(String bootstrap, String topic, Map<String, String> props) throws Exception {
        try (Admin admin = Admin.create(driverParams(bootstrap, props))) {
            TopicDescription d = describe(admin, topic).get(topic);
            System.out.println("topic=" + d.name() + " partitions=" + d.partitions().size());
            for (TopicPartitionInfo pi : d.partitions()) {
                System.out.println("partition=" + pi.partition()
                        + " leader=" + (pi.leader() == null ? -1 : pi.leader().id())
                        + " replicas=" + ids(pi.replicas()) + " isr=" + ids(pi.isr()));
            }
        }
    }

    /**
     * Mirrors KafkaOffsetReaderAdmin:
     *   earliest       -> fetchEarliestOffsets: listOffsets(tp -> OffsetSpec.earliest())
     *   latest         -> fetchLatestOffsets:   listOffsets(tp -> OffsetSpec.latest())
     *   <timestamp-ms> -> fetchSpecificTimestampBasedOffsets (startingTimestampOffsets /
     *                     startingOffsetsByTimestamp): listOffsets(tp -> OffsetSpec.forTimestamp(ts));
     *                     an offset of -1 means "no record at/after ts", which Spark maps per
     *                     startingOffsetsByTimestampStrategy (error, or latest)
     *   max-timestamp  -> OffsetSpec.maxTimestamp() (not used by Spark; ListOffsets -3)
     * always with ListOffsetsOptions(IsolationLevel) built from kafka.isolation.level
     * (read_uncommitted unless --read-committed).
     */
    static void listOffsets(String bootstrap, String topic, String spec, boolean readCommitted,
                            Map<String, String> props) throws Exception {
        try (Admin admin = Admin.create(driverParams(bootstrap, props))) {
            TopicDescription d = describe(admin, topic).get(topic);
            String[] specs = spec.split(",");
            for (String one : specs) {
                OffsetSpec offsetSpec = switch (one) {
                    case "earliest" -> OffsetSpec.earliest();
                    case "latest" -> OffsetSpec.latest();
                    case "max-timestamp" -> OffsetSpec.maxTimestamp();
                    default -> OffsetSpec.forTimestamp(Long.parseLong(one));
                };
                Map<TopicPartition, OffsetSpec> request = new LinkedHashMap<>();
                for (TopicPartitionInfo pi : d.partitions()) {
                    request.put(new TopicPartition(topic, pi.partition()), offsetSpec);
                }
                ListOffsetsOptions options = new ListOffsetsOptions(
                        readCommitted ? IsolationLevel.READ_COMMITTED : IsolationLevel.READ_UNCOMMITTED);
                Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> result =
                        admin.listOffsets(request, options).all().get();
                List<TopicPartition> tps = new ArrayList<>(result.keySet());
                tps.sort(Comparator.comparingInt(TopicPartition::partition));
                if (specs.length > 1) System.out.println("spec=" + one);
                for (TopicPartition tp : tps) {
                    ListOffsetsResult.ListOffsetsResultInfo info = result.get(tp);
                    System.out.println(tp.partition() + "=" + info.offset());
                    System.err.println("spec " + one + " partition " + tp.partition() + ": offset="
                            + info.offset() + " timestamp=" + info.timestamp()
                            + " leaderEpoch=" + info.leaderEpoch());
                }
            }
        }
    }

    /**
     * Mirrors SubscribePatternStrategy.assignedTopicPartitions (subscribePattern): Admin
     * .listTopics().listings() (internal topics are not listed by default), keep the names in
     * which the regex is FOUND (Scala Regex.findFirstIn — a search, not a whole-name match),
     * then ConsumerStrategy.retrieveAllPartitions: describeTopics(names).allTopicNames(),
     * drop internal topics, every partition of each description.
     */
    static void listPattern(String bootstrap, String regex, Map<String, String> props) throws Exception {
        java.util.regex.Pattern pattern = java.util.regex.Pattern.compile(regex);
        try (Admin admin = Admin.create(driverParams(bootstrap, props))) {
            List<String> names = new ArrayList<>();
            for (org.apache.kafka.clients.admin.TopicListing l : admin.listTopics().listings().get()) {
                if (pattern.matcher(l.name()).find()) names.add(l.name());
            }
            Map<String, TopicDescription> ds = names.isEmpty() ? Map.of()
                    : admin.describeTopics(names).allTopicNames().get();
            for (String t : new TreeSet<>(ds.keySet())) {
                TopicDescription d = ds.get(t);
                if (d.isInternal()) continue;
                System.out.println("topic=" + t + " partitions=" + d.partitions().size());
            }
        }
    }

    /** Not a Spark step: cuts a partition's head the way `kafka-delete-records.sh` does, so the
     *  executors' data-loss path can be exercised. */
    static void deleteRecords(String bootstrap, String topic, int partition, long before,
                              Map<String, String> props) throws Exception {
        TopicPartition tp = new TopicPartition(topic, partition);
        try (Admin admin = Admin.create(driverParams(bootstrap, props))) {
            long low = admin.deleteRecords(Map.of(tp, org.apache.kafka.clients.admin.RecordsToDelete
                    .beforeOffset(before))).lowWatermarks().get(tp).get().lowWatermark();
            System.out.println("low_watermark=" + low);
        }
    }

    // ---------------------------------------------------------------- executors (KafkaConsumer)

    /**
     * KafkaSourceProvider.kafkaParamsForExecutors: byte-array deserializers,
     * auto.offset.reset=none (a position must always come from seek), group.id
     * "<uniqueGroupId>-executor" (never joined: assign() only), enable.auto.commit=false,
     * receive.buffer.bytes=65536.
     */
    static Properties executorParams(String bootstrap, Map<String, String> overrides) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        p.put(ConsumerConfig.GROUP_ID_CONFIG, "spark-kafka-source-" + UUID.randomUUID() + "-executor");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.RECEIVE_BUFFER_CONFIG, "65536");
        p.putAll(overrides);
        return p;
    }

    /**
     * Mirrors InternalKafkaConsumer.getAvailableOffsetRange (Spark calls it when a fetch comes
     * back short, to tell data loss from a slow broker): seekToBeginning + position,
     * seekToEnd + position — the consumer's own ListOffsets -2 / -1 path.
     */
    static void offsetRange(String bootstrap, String topic, int partition, Map<String, String> props) {
        TopicPartition tp = new TopicPartition(topic, partition);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(executorParams(bootstrap, props))) {
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(Set.of(tp));
            long earliest = consumer.position(tp);
            consumer.seekToEnd(Set.of(tp));
            long latest = consumer.position(tp);
            System.out.println("earliest=" + earliest + " latest=" + latest);
        }
    }

    /**
     * Mirrors KafkaDataConsumer.get + InternalKafkaConsumer.fetch/fetchData for one task's
     * offset range [from, until): one consumer per topic-partition, assign(List(tp)) (never
     * subscribe), seek(offset), poll(pollTimeoutMs), record the position after the poll
     * (FetchedData.withNewPoll(records, consumer.position(tp))), and consume records in
     * order. Spark's KafkaDataConsumer.get treats any record whose offset is not the one it
     * asked for as a gap (data loss / failOnDataLoss); with no transactions or compaction
     * every offset must be present, so a gap here is a mismatch (exit 3). An empty poll that
     * leaves the position unmoved until the deadline is Spark's "Cannot fetch record for
     * offset X in N milliseconds" TimeoutException (exit 3).
     */
    static void consumeRange(String bootstrap, String topic, int partition, long from, long until,
                             boolean print, long timeoutMs, Map<String, String> props) {
        TopicPartition tp = new TopicPartition(topic, partition);
        CRC32 crc = new CRC32();
        long count = 0, first = -1, last = -1;
        long next = from;
        long deadline = System.currentTimeMillis() + timeoutMs;
        StringBuilder out = new StringBuilder();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(executorParams(bootstrap, props))) {
            // InternalKafkaConsumer.createConsumer: assign the single partition.
            consumer.assign(List.of(tp));
            // InternalKafkaConsumer.seek(offset) before the first fetch.
            consumer.seek(tp, from);
            while (next < until) {
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    throw new Mismatch("TIMEOUT Cannot fetch record for offset " + next + " in "
                            + timeoutMs + " milliseconds (range [" + from + ", " + until + "), got "
                            + count + ")");
                }
                // InternalKafkaConsumer.fetchData: consumer.poll(Duration.ofMillis(pollTimeoutMs)).
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(Math.min(left, 2000)));
                long positionAfterPoll = consumer.position(tp);
                for (ConsumerRecord<byte[], byte[]> r : records.records(tp)) {
                    if (r.offset() >= until) break; // Spark stops at untilOffset (exclusive)
                    if (r.offset() != next) {
                        throw new Mismatch("GAP expected offset " + next + " got " + r.offset()
                                + " (position after poll " + positionAfterPoll + ")");
                    }
                    update(crc, r.offset(), r.key(), r.value());
                    if (first < 0) first = r.offset();
                    last = r.offset();
                    count++;
                    next = r.offset() + 1;
                    if (print) {
                        out.append("R ").append(r.offset()).append(' ').append(r.timestamp()).append(' ')
                                .append(hex(r.key())).append(' ').append(hex(r.value())).append(' ')
                                .append(r.headers().toArray().length).append('\n');
                    }
                }
                if (records.isEmpty()) {
                    System.err.println("empty poll at offset " + next + " position=" + positionAfterPoll);
                }
            }
        }
        System.out.print(out);
        System.out.println("count=" + count + " first=" + first + " last=" + last
                + " crc=" + String.format("%08x", crc.getValue()));
    }

    /** Spark's data-loss error (QueryExecutionErrors.couldNotReadOffsetRangeInKafkaError). */
    static final class DataLoss extends RuntimeException {
        private static final long serialVersionUID = 1L;
        DataLoss(String msg, Throwable cause) { super(msg, cause); }
    }

    static final long UNKNOWN_OFFSET = -2L; // KafkaDataConsumer.UNKNOWN_OFFSET

    /** InternalKafkaConsumer: one KafkaConsumer (executor params) assigned one partition. */
    static final class InternalConsumer implements AutoCloseable {
        final TopicPartition tp;
        final KafkaConsumer<byte[], byte[]> consumer;
        int polls;

        InternalConsumer(String bootstrap, TopicPartition tp, Map<String, String> props) {
            this.tp = tp;
            // InternalKafkaConsumer.createConsumer: new KafkaConsumer + assign(List(tp)).
            this.consumer = new KafkaConsumer<>(executorParams(bootstrap, props));
            consumer.assign(List.of(tp));
        }

        /** InternalKafkaConsumer.getAvailableOffsetRange: seekToBeginning + position,
         *  seekToEnd + position (the consumer's ListOffsets -2 / -1). */
        long[] availableOffsetRange() {
            consumer.seekToBeginning(Set.of(tp));
            long earliest = consumer.position(tp);
            consumer.seekToEnd(Set.of(tp));
            long latest = consumer.position(tp);
            return new long[]{earliest, latest};
        }

        /** InternalKafkaConsumer.fetch: seek(offset), poll(pollTimeoutMs), position after the
         *  poll, then getAvailableOffsetRange on EVERY poll. An empty poll is turned into an
         *  OffsetOutOfRangeException when offset is outside [earliest, latest), or into
         *  "Cannot fetch record for offset X" when the position did not move. */
        List<ConsumerRecord<byte[], byte[]>> fetch(long offset, long pollTimeoutMs, long[] afterPollOut) {
            consumer.seek(tp, offset);
            ConsumerRecords<byte[], byte[]> p = consumer.poll(Duration.ofMillis(pollTimeoutMs));
            polls++;
            List<ConsumerRecord<byte[], byte[]>> r = p.records(tp);
            long offsetAfterPoll = consumer.position(tp);
            long[] range = availableOffsetRange();
            if (r.isEmpty()) {
                if (offset < range[0] || offset >= range[1]) {
                    throw new org.apache.kafka.clients.consumer.OffsetOutOfRangeException(Map.of(tp, offset));
                } else if (offset == offsetAfterPoll) {
                    throw new Mismatch("TIMEOUT Cannot fetch record for offset " + offset + " in "
                            + pollTimeoutMs + " milliseconds");
                }
            }
            afterPollOut[0] = offsetAfterPoll;
            afterPollOut[1] = range[0];
            afterPollOut[2] = range[1];
            return r;
        }

        @Override public void close() { consumer.close(); }
    }

    /**
     * Mirrors one task of KafkaBatchPartitionReader / KafkaSourceRDD over [from, until):
     * nextOffset = from; while nextOffset < until: record = KafkaDataConsumer.get(nextOffset,
     * until, pollTimeoutMs, failOnDataLoss); null ends the range. KafkaDataConsumer.get keeps
     * the records of the last poll (FetchedData) and polls again only when they are drained
     * (fetchRecord); on OffsetOutOfRangeException it drops the consumer (releaseConsumer) and
     * either fails (failOnDataLoss=true: throwOnDataLoss) or resumes at
     * getEarliestAvailableOffsetBetween(offset, until) — the earliest still-available offset,
     * or UNKNOWN_OFFSET (skip the rest) when [offset, until) and [earliest, latest) do not
     * overlap. A record past the asked offset below the log start is data loss as well.
     */
    static void sparkGet(String bootstrap, String topic, int partition, long from, long until,
                         boolean failOnDataLoss, long pollTimeoutMs, Map<String, String> props) {
        TopicPartition tp = new TopicPartition(topic, partition);
        CRC32 crc = new CRC32();
        long count = 0, first = -1, last = -1, skipped = 0;
        int polls = 0;
        InternalConsumer consumer = new InternalConsumer(bootstrap, tp, props);
        // FetchedData: the records of the last poll, where we are in them, what the poll saw.
        List<ConsumerRecord<byte[], byte[]>> fetched = List.of();
        int idx = 0;
        long nextInFetched = UNKNOWN_OFFSET;
        long[] afterPoll = {UNKNOWN_OFFSET, UNKNOWN_OFFSET, UNKNOWN_OFFSET};
        long nextOffset = from;
        try {
            while (nextOffset < until) {
                long toFetch = nextOffset;
                ConsumerRecord<byte[], byte[]> record = null;
                while (toFetch != UNKNOWN_OFFSET && record == null) {
                    try {
                        // fetchRecord: poll only on a fresh offset or drained data.
                        if (toFetch != nextInFetched || idx >= fetched.size()) {
                            if (toFetch == nextInFetched && toFetch < afterPoll[0]) {
                                toFetch = afterPoll[0]; // invisible offsets (not produced here)
                                fetched = List.of(); idx = 0; nextInFetched = UNKNOWN_OFFSET;
                                continue;
                            }
                            fetched = consumer.fetch(toFetch, pollTimeoutMs, afterPoll);
                            idx = 0;
                            nextInFetched = toFetch;
                        }
                        if (idx >= fetched.size()) { // polled something, none of it visible
                            toFetch = afterPoll[0];
                            fetched = List.of(); nextInFetched = UNKNOWN_OFFSET;
                            if (toFetch >= until) toFetch = UNKNOWN_OFFSET;
                            continue;
                        }
                        ConsumerRecord<byte[], byte[]> r = fetched.get(idx++);
                        nextInFetched = r.offset() + 1;
                        if (r.offset() > toFetch) {
                            if (afterPoll[1] <= toFetch) { // still in the log: invisible, jump
                                idx--; nextInFetched = r.offset();
                                toFetch = r.offset();
                                continue;
                            }
                            if (failOnDataLoss) {
                                throw new DataLoss("Cannot fetch offsets [" + toFetch + ", " + r.offset()
                                        + ") of " + tp + ": gone (earliest " + afterPoll[1] + ")", null);
                            }
                            if (r.offset() >= until) {
                                skipped += until - toFetch;
                                toFetch = UNKNOWN_OFFSET;
                                continue;
                            }
                            skipped += r.offset() - toFetch;
                        } else if (r.offset() < toFetch) {
                            throw new IllegalStateException("Tried to fetch " + toFetch + " but got " + r.offset());
                        }
                        record = r;
                    } catch (org.apache.kafka.clients.consumer.OffsetOutOfRangeException e) {
                        // releaseConsumer + fetchedData.reset: a new consumer for what follows.
                        consumer.close();
                        polls += consumer.polls;
                        consumer = new InternalConsumer(bootstrap, tp, props);
                        fetched = List.of(); idx = 0; nextInFetched = UNKNOWN_OFFSET;
                        if (failOnDataLoss) {
                            throw new DataLoss("Cannot fetch offsets [" + toFetch + ", " + until + ") of "
                                    + tp + " (failOnDataLoss=true)", e);
                        }
                        // getEarliestAvailableOffsetBetween(consumer, toFetch, until)
                        long[] range = consumer.availableOffsetRange();
                        System.err.println("data loss at " + toFetch + ": available range ["
                                + range[0] + ", " + range[1] + ")");
                        long old = toFetch;
                        if (toFetch >= range[1] || range[0] >= until) {
                            toFetch = UNKNOWN_OFFSET;
                            skipped += until - old;
                        } else if (toFetch < range[0]) {
                            toFetch = range[0];
                            skipped += toFetch - old;
                        }
                    }
                }
                if (record == null) break; // KafkaDataConsumer.get returned null: range done
                update(crc, record.offset(), record.key(), record.value());
                if (first < 0) first = record.offset();
                last = record.offset();
                count++;
                nextOffset = record.offset() + 1;
            }
        } finally {
            polls += consumer.polls;
            consumer.close();
        }
        System.out.println("count=" + count + " first=" + first + " last=" + last
                + " crc=" + String.format("%08x", crc.getValue()) + " skipped=" + skipped + " polls=" + polls);
    }

    // ---------------------------------------------------------------- sink (KafkaProducer)

    /**
     * Mirrors KafkaSourceProvider.kafkaParamsForProducer: only key/value ByteArraySerializer
     * are set; everything else is the kafka-clients default — enable.idempotence=true and
     * acks=all (so InitProducerId, then Produce with producer id/epoch/sequence numbers).
     */
    static Properties producerParams(String bootstrap, Map<String, String> overrides) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.putAll(overrides);
        return p;
    }

    /**
     * Mirrors KafkaWriteTask.execute/sendRow: one ProducerRecord per row with
     * (topic, partition-or-null, timestamp = null, key, value, headers), send with a callback
     * that remembers the first failure (failedWrite), then KafkaWriteTask.close ->
     * producer.flush() and checkForErrors(). Spark's sink never sets a timestamp; --ts-base
     * exists so tests can know each record's CreateTime exactly.
     * Record i: key "key-<i>", value "value-<i>-" padded with '.' to --value-size bytes.
     */
    static void produce(String bootstrap, String topic, int n, Integer partition, Long tsBase, long tsStep,
                        int valueSize, boolean headers, Map<String, String> props) throws Exception {
        AtomicReference<Exception> failedWrite = new AtomicReference<>();
        AtomicLong acked = new AtomicLong();
        Map<Integer, long[]> perPartition = new TreeMap<>(); // partition -> {min, max, count}
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerParams(bootstrap, props))) {
            for (int i = 0; i < n; i++) {
                if (failedWrite.get() != null) break; // KafkaWriteTask.checkForErrors per row
                byte[] key = ("key-" + i).getBytes(StandardCharsets.UTF_8);
                byte[] value = value(i, valueSize);
                List<Header> hs = headers
                        ? List.of(new RecordHeader("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8)))
                        : null;
                Long ts = tsBase == null ? null : tsBase + i * tsStep;
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, partition, ts, key, value, hs);
                producer.send(rec, (RecordMetadata md, Exception e) -> {
                    if (e != null) {
                        failedWrite.compareAndSet(null, e);
                        return;
                    }
                    acked.incrementAndGet();
                    synchronized (perPartition) {
                        long[] s = perPartition.computeIfAbsent(md.partition(),
                                k -> new long[]{Long.MAX_VALUE, Long.MIN_VALUE, 0});
                        s[0] = Math.min(s[0], md.offset());
                        s[1] = Math.max(s[1], md.offset());
                        s[2]++;
                    }
                });
            }
            // KafkaWriteTask.close: producer.flush(), then checkForErrors().
            producer.flush();
        }
        System.out.println("acked=" + acked.get());
        synchronized (perPartition) {
            for (Map.Entry<Integer, long[]> e : perPartition.entrySet()) {
                long[] s = e.getValue();
                System.out.println("partition=" + e.getKey() + " min=" + s[0] + " max=" + s[1] + " count=" + s[2]);
            }
        }
        if (failedWrite.get() != null) throw failedWrite.get();
    }

    // ---------------------------------------------------------------- helpers

    static byte[] value(int i, int size) {
        byte[] head = ("value-" + i + "-").getBytes(StandardCharsets.UTF_8);
        byte[] v = new byte[Math.max(size, head.length)];
        Arrays.fill(v, (byte) '.');
        System.arraycopy(head, 0, v, 0, head.length);
        return v;
    }

    static void update(CRC32 crc, long offset, byte[] key, byte[] value) {
        crc.update(ByteBuffer.allocate(8).putLong(offset).array());
        for (byte[] b : new byte[][]{key, value}) {
            crc.update(ByteBuffer.allocate(4).putInt(b == null ? -1 : b.length).array());
            if (b != null) crc.update(b);
        }
    }

    static String hex(byte[] b) {
        if (b == null) return "-";
        StringBuilder s = new StringBuilder(b.length * 2);
        for (byte x : b) s.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        return s.length() == 0 ? "\"\"" : s.toString();
    }

    static String ids(List<Node> nodes) {
        StringJoiner j = new StringJoiner(",");
        for (Node n : nodes) j.add(Integer.toString(n.id()));
        return j.toString();
    }
}
