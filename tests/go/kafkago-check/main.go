// kafkago-check drives segmentio/kafka-go (Debian's golang-github-segmentio-kafka-go-dev,
// 0.2.1) against a broker for tests/e2e/test_go_clients.py and prints one JSON object.
//
// kafka-go 0.2 predates record batches v2: it produces with Produce v2 (magic-1 message
// sets) and fetches with Fetch v2, which canopy refuses as Kafka 4 does (KIP-896); see
// tests/e2e/FINDINGS.md. Metadata, topic admin and offsets for times work.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	kafka "github.com/segmentio/kafka-go"
)

var (
	broker = flag.String("broker", "127.0.0.1:9092", "host:port")
	topic  = flag.String("topic", "", "topic")
	part   = flag.Int("partition", 0, "partition")
	parts  = flag.Int("partitions", 1, "partitions for create")
	times  = flag.String("times", "", "comma-separated timestamps (ms) for ReadOffset")
)

func out(v map[string]interface{}) { json.NewEncoder(os.Stdout).Encode(v) }

func fail(err error) {
	out(map[string]interface{}{"error": err.Error()})
	os.Exit(0)
}

func dial() *kafka.Conn {
	c, err := kafka.Dial("tcp", *broker)
	if err != nil {
		fail(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func leader() *kafka.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kafka.DialLeader(ctx, "tcp", *broker, *topic, *part)
	if err != nil {
		fail(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kafkago-check create|delete|partitions|offsets|produce [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	flag.CommandLine.Parse(os.Args[2:])
	switch cmd {
	case "create":
		c := dial()
		defer c.Close()
		if err := c.CreateTopics(kafka.TopicConfig{Topic: *topic, NumPartitions: *parts, ReplicationFactor: 1}); err != nil {
			fail(err)
		}
		out(map[string]interface{}{"ok": true})
	case "delete":
		c := dial()
		defer c.Close()
		if err := c.DeleteTopics(*topic); err != nil {
			fail(err)
		}
		out(map[string]interface{}{"ok": true})
	case "partitions":
		c := dial()
		defer c.Close()
		ps, err := c.ReadPartitions(*topic)
		if err != nil {
			fail(err)
		}
		ids := []int{}
		for _, p := range ps {
			ids = append(ids, p.ID)
		}
		out(map[string]interface{}{"partitions": ids})
	case "offsets":
		c := leader()
		defer c.Close()
		first, last, err := c.ReadOffsets()
		if err != nil {
			fail(err)
		}
		answers := map[string]int64{}
		for _, s := range strings.Split(*times, ",") {
			ms, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				fail(err)
			}
			o, err := c.ReadOffset(time.Unix(0, ms*int64(time.Millisecond)))
			if err != nil {
				fail(err)
			}
			answers[s] = o
		}
		out(map[string]interface{}{"first": first, "last": last, "offsets": answers})
	case "produce":
		c := leader()
		defer c.Close()
		_, err := c.WriteMessages(kafka.Message{Key: []byte("k"), Value: []byte("v")})
		if err != nil {
			fail(err)
		}
		out(map[string]interface{}{"ok": true})
	default:
		fmt.Fprintln(os.Stderr, "unknown command", cmd)
		os.Exit(2)
	}
}
