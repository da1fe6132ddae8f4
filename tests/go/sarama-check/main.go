// sarama-check drives Shopify/sarama (Debian's golang-github-shopify-sarama-dev, 1.22)
// against a broker for tests/e2e/test_go_clients.py. Each subcommand does one thing a
// sarama application does and prints one JSON object on stdout; errors go to the JSON
// too, so the test sees what reached the application.
//
// Built in GOPATH mode (GO111MODULE=off) by the test setup; see the Makefile's go-clients.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

var (
	brokers = flag.String("brokers", "127.0.0.1:9092", "bootstrap host:port")
	topic   = flag.String("topic", "", "topic")
	group   = flag.String("group", "", "consumer group")
	codec   = flag.String("codec", "none", "none, gzip, snappy, lz4, zstd")
	count   = flag.Int("n", 10, "records to produce / consume")
	part    = flag.Int("partition", 0, "partition to produce to")
	ts0     = flag.Int64("ts0", 0, "timestamp (ms) of the first record; 0 = now")
	step    = flag.Int64("step", 1, "ms between record timestamps")
	batch   = flag.Int("batch", 1, "records per SendMessages call (one record batch)")
	idem    = flag.Bool("idempotent", false, "enable the idempotent producer")
	times   = flag.String("times", "", "comma-separated timestamps for GetOffset")
	parts   = flag.Int("partitions", 1, "partitions for create")
	prefix  = flag.String("prefix", "v", "value prefix")
	stamps  = flag.String("stamps", "", "comma-separated record timestamps (ms); sets -n")
)

func config() *sarama.Config {
	cfg := sarama.NewConfig()
	// The default Version (0.8.2) writes magic-0 message sets, which canopy refuses as
	// Kafka 4 does; 2.1 gives record batches v2 (README, compatibility table).
	cfg.Version = sarama.V2_1_0_0
	cfg.ClientID = "sarama-check"
	cfg.Admin.Timeout = 10 * time.Second
	cfg.Metadata.Retry.Max = 10
	cfg.Metadata.Retry.Backoff = 200 * time.Millisecond
	return cfg
}

func out(v map[string]interface{}) {
	json.NewEncoder(os.Stdout).Encode(v)
}

func fail(err error) {
	out(map[string]interface{}{"error": err.Error()})
	os.Exit(0)
}

func produce() {
	cfg := config()
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Retry.Max = 3
	switch *codec {
	case "none":
		cfg.Producer.Compression = sarama.CompressionNone
	case "gzip":
		cfg.Producer.Compression = sarama.CompressionGZIP
	case "snappy":
		cfg.Producer.Compression = sarama.CompressionSnappy
	case "lz4":
		cfg.Producer.Compression = sarama.CompressionLZ4
	case "zstd":
		cfg.Producer.Compression = sarama.CompressionZSTD
	}
	if *idem {
		cfg.Producer.Idempotent = true
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Net.MaxOpenRequests = 1
	}
	p, err := sarama.NewSyncProducer(strings.Split(*brokers, ","), cfg)
	if err != nil {
		fail(err)
	}
	defer p.Close()
	base := *ts0
	if base == 0 {
		base = time.Now().UnixNano() / 1e6
	}
	var explicit []int64
	if *stamps != "" {
		for _, s := range strings.Split(*stamps, ",") {
			t, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				fail(err)
			}
			explicit = append(explicit, t)
		}
		*count = len(explicit)
	}
	offsets := []int64{}
	for i := 0; i < *count; i += *batch {
		msgs := []*sarama.ProducerMessage{}
		for j := i; j < i+*batch && j < *count; j++ {
			ts := base + int64(j)**step
			if explicit != nil {
				ts = explicit[j]
			}
			msgs = append(msgs, &sarama.ProducerMessage{
				Topic: *topic, Partition: int32(*part),
				Key:       sarama.StringEncoder(fmt.Sprintf("k%d", j)),
				Value:     sarama.StringEncoder(fmt.Sprintf("%s%d", *prefix, j)),
				Timestamp: time.Unix(0, ts*int64(time.Millisecond)),
			})
		}
		if err := p.SendMessages(msgs); err != nil {
			if errs, ok := err.(sarama.ProducerErrors); ok && len(errs) > 0 {
				fail(errs[0].Err)
			}
			fail(err)
		}
		for _, m := range msgs {
			offsets = append(offsets, m.Offset)
		}
	}
	out(map[string]interface{}{"offsets": offsets})
}

func getOffsets() {
	client, err := sarama.NewClient(strings.Split(*brokers, ","), config())
	if err != nil {
		fail(err)
	}
	defer client.Close()
	answers := map[string]int64{}
	for _, s := range strings.Split(*times, ",") {
		t, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fail(err)
		}
		o, err := client.GetOffset(*topic, int32(*part), t)
		if err != nil {
			fail(err)
		}
		answers[s] = o
	}
	out(map[string]interface{}{"offsets": answers})
}

type handler struct {
	mu     sync.Mutex
	want   int
	values []string
	done   chan struct{}
	once   sync.Once
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.mu.Lock()
		if len(h.values) < h.want {
			h.values = append(h.values, string(msg.Value))
			sess.MarkMessage(msg, "")
		}
		if len(h.values) >= h.want {
			h.once.Do(func() { close(h.done) })
		}
		h.mu.Unlock()
	}
	return nil
}

// consumeGroup joins *group, consumes *count records (marking each), then leaves;
// closing the group flushes the offset manager's commit (OffsetCommit v1 in 1.22).
func consumeGroup() {
	cfg := config()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	g, err := sarama.NewConsumerGroup(strings.Split(*brokers, ","), *group, cfg)
	if err != nil {
		fail(err)
	}
	h := &handler{want: *count, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{*topic}, h); err != nil {
				errs <- err
				return
			}
		}
	}()
	select {
	case <-h.done:
	case err := <-errs:
		fail(err)
	case err := <-g.Errors():
		fail(err)
	case <-time.After(60 * time.Second):
		h.mu.Lock()
		n := len(h.values)
		h.mu.Unlock()
		fail(fmt.Errorf("timed out after %d of %d records", n, *count))
	}
	cancel()
	if err := g.Close(); err != nil {
		fail(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out(map[string]interface{}{"values": h.values})
}

func admin(create bool) {
	a, err := sarama.NewClusterAdmin(strings.Split(*brokers, ","), config())
	if err != nil {
		fail(err)
	}
	defer a.Close()
	if create {
		err = a.CreateTopic(*topic, &sarama.TopicDetail{NumPartitions: int32(*parts), ReplicationFactor: 1}, false)
	} else {
		err = a.DeleteTopic(*topic)
	}
	if err != nil {
		fail(err)
	}
	md, err := a.DescribeTopics([]string{*topic})
	if err != nil {
		fail(err)
	}
	res := map[string]interface{}{"ok": true}
	if len(md) == 1 {
		res["topic_error"] = int(md[0].Err)
		res["partitions"] = len(md[0].Partitions)
	}
	out(res)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sarama-check produce|offsets|group|create|delete [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	flag.CommandLine.Parse(os.Args[2:])
	switch cmd {
	case "produce":
		produce()
	case "offsets":
		getOffsets()
	case "group":
		consumeGroup()
	case "create":
		admin(true)
	case "delete":
		admin(false)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", cmd)
		os.Exit(2)
	}
}
