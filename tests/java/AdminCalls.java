// AdminCalls: the Java AdminClient's admin calls of issue 12 against a broker, one after the
// other, each printing one line `step=<name> ok ...` or `step=<name> error=<exception class>
// message=<...>` for tests/e2e/test_java_admin.py to check (Kafka's answers for bad input
// arrive as exceptions of the matching class). Java 17 stdlib + kafka-clients only; compiles
// against 3.9.1 and 4.3.0 (so no Admin.alterConfigs: 4.0 removed it).
//
// Usage: AdminCalls <bootstrap> <topic> <group>

import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class AdminCalls {
    interface Step { String run() throws Exception; }

    static void step(String name, Step s) {
        try {
            String out = s.run();
            System.out.println("step=" + name + " ok" + (out == null || out.isEmpty() ? "" : " " + out));
        } catch (Throwable e) {
            Throwable root = (e instanceof ExecutionException && e.getCause() != null) ? e.getCause() : e;
            String msg = String.valueOf(root.getMessage()).replace('\n', ' ').replace(' ', '_');
            System.out.println("step=" + name + " error=" + root.getClass().getSimpleName() + " message=" + msg);
        }
        System.out.flush();
    }

    static String describe(Admin admin, ConfigResource r, String... names) throws Exception {
        Config c = admin.describeConfigs(List.of(r), new DescribeConfigsOptions().includeSynonyms(true))
                .all().get().get(r);
        StringBuilder sb = new StringBuilder();
        for (String n : names) {
            ConfigEntry e = c.get(n);
            if (e == null) {
                sb.append(n).append("=absent ");
                continue;
            }
            sb.append(n).append("=").append(e.value()).append(" ").append(n).append(".source=").append(e.source())
              .append(" ").append(n).append(".default=").append(e.isDefault()).append(" ")
              .append(n).append(".synonyms=");
            List<String> syn = new ArrayList<>();
            for (ConfigEntry.ConfigSynonym s : e.synonyms()) syn.add(s.name() + ":" + s.source());
            sb.append(String.join(",", syn)).append(" ");
        }
        return sb.toString().trim();
    }

    static void set(Admin admin, ConfigResource r, String name, String value, AlterConfigOp.OpType op,
                    boolean validateOnly) throws Exception {
        Map<ConfigResource, Collection<AlterConfigOp>> m =
                Map.of(r, List.of(new AlterConfigOp(new ConfigEntry(name, value), op)));
        admin.incrementalAlterConfigs(m, new AlterConfigsOptions().validateOnly(validateOnly)).all().get();
    }

    public static void main(String[] argv) throws Exception {
        String bootstrap = argv[0], topic = argv[1], group = argv[2];
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        ConfigResource tr = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        ConfigResource br = new ConfigResource(ConfigResource.Type.BROKER, "0");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (Admin admin = Admin.create(p)) {
            step("create", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1)
                        .configs(Map.of("delete.retention.ms", "3600000", "min.compaction.lag.ms", "10")))).all().get();
                return "";
            });
            step("create-unknown-config", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-bad1", 1, (short) 1)
                        .configs(Map.of("no.such.config", "1")))).all().get();
                return "";
            });
            step("create-out-of-range", () -> {
                admin.createTopics(List.of(new NewTopic(topic + "-bad2", 1, (short) 1)
                        .configs(Map.of("retention.ms", "-5")))).all().get();
                return "";
            });
            step("describe-created", () -> describe(admin, tr, "delete.retention.ms", "retention.ms"));
            step("alter-validate-only", () -> {
                set(admin, tr, "retention.ms", "3600000", AlterConfigOp.OpType.SET, true);
                return describe(admin, tr, "retention.ms");
            });
            step("alter", () -> {
                set(admin, tr, "retention.ms", "3600000", AlterConfigOp.OpType.SET, false);
                return describe(admin, tr, "retention.ms");
            });
            step("alter-unknown-config", () -> {
                set(admin, tr, "no.such.config", "1", AlterConfigOp.OpType.SET, false);
                return "";
            });
            step("alter-out-of-range", () -> {
                set(admin, tr, "min.insync.replicas", "0", AlterConfigOp.OpType.SET, false);
                return "";
            });
            step("alter-broker-dynamic", () -> {
                set(admin, br, "log.retention.bytes", "1073741824", AlterConfigOp.OpType.SET, false);
                return describe(admin, tr, "retention.bytes");
            });
            step("alter-broker-static", () -> {
                set(admin, br, "num.partitions", "3", AlterConfigOp.OpType.SET, false);
                return "";
            });
            step("alter-broker-delete", () -> {
                set(admin, br, "log.retention.bytes", null, AlterConfigOp.OpType.DELETE, false);
                return describe(admin, tr, "retention.bytes");
            });

            Properties pp = new Properties();
            pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
            pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
                for (int i = 0; i < 5; i++) producer.send(new ProducerRecord<>(topic, 0, null, ("v" + i).getBytes())).get();
            }
            step("describe-producers", () -> {
                var r = admin.describeProducers(List.of(tp)).partitionResult(tp).get();
                StringBuilder sb = new StringBuilder("producers=" + r.activeProducers().size());
                for (ProducerState s : r.activeProducers()) sb.append(" last_sequence=").append(s.lastSequence());
                return sb.toString();
            });
            step("describe-log-dirs", () -> {
                var dirs = admin.describeLogDirs(List.of(0)).allDescriptions().get().get(0);
                StringBuilder sb = new StringBuilder("dirs=" + dirs.size());
                for (var d : dirs.values()) {
                    ReplicaInfo ri = d.replicaInfos().get(tp);
                    sb.append(" size=").append(ri == null ? -1 : ri.size());
                }
                return sb.toString();
            });
            step("elect-preferred", () -> {
                Map<TopicPartition, Optional<Throwable>> r =
                        admin.electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions().get();
                Optional<Throwable> e = r.get(tp);
                return "result=" + (e.isPresent() ? e.get().getClass().getSimpleName() : "elected");
            });

            Properties cp = new Properties();
            cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
            KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp);
            consumer.subscribe(List.of(topic));
            int got = 0;
            long deadline = System.currentTimeMillis() + 60_000;
            while (got < 5 && System.currentTimeMillis() < deadline) got += consumer.poll(Duration.ofMillis(500)).count();
            consumer.commitSync();
            System.out.println("consumed=" + got);
            step("delete-group-non-empty", () -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return "";
            });
            step("delete-offsets-subscribed", () -> {
                admin.deleteConsumerGroupOffsets(group, Set.of(tp)).partitionResult(tp).get();
                return "";
            });
            consumer.close();
            step("delete-offsets", () -> {
                admin.deleteConsumerGroupOffsets(group, Set.of(tp)).partitionResult(tp).get();
                var left = admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                return "left=" + left.size();
            });
            step("delete-group", () -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return "";
            });
            step("delete-group-unknown", () -> {
                admin.deleteConsumerGroups(List.of(group + "-unknown")).all().get();
                return "";
            });
        }
        System.exit(0);
    }
}
