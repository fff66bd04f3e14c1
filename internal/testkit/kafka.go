package testkit

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/kafkautil"
)

// KafkaEnv is the switch that chooses the broker of Broker: unset or
// "embedded" for the embedded broker, "apache" for Apache Kafka (make
// test/kafka).
const KafkaEnv = kafkautil.TestKafkaEnv

// KafkaJVMsEnv bounds how many Apache Kafka nodes one test binary runs at
// once (each a JVM). Defaults to 2.
const KafkaJVMsEnv = kafkautil.TestKafkaJVMsEnv

// ApacheKafkaEnabled reports whether Broker gives tests Apache Kafka.
func ApacheKafkaEnabled() bool { return os.Getenv(KafkaEnv) == "apache" }

// TestBroker is the broker of one test.
type TestBroker struct {
	addr    string
	close   func()
	restart func() error
}

// Addr is the bootstrap address.
func (b *TestBroker) Addr() string { return b.addr }

// Close stops the broker (Cleanup stops it too).
func (b *TestBroker) Close() { b.close() }

// Restart starts the broker again on the same address with promptline's
// topics: the embedded broker comes back empty, Apache Kafka with its data.
func (b *TestBroker) Restart() error { return b.restart() }

var jvms = func() chan struct{} {
	n, err := strconv.Atoi(os.Getenv(KafkaJVMsEnv))
	if err != nil || n < 1 {
		n = 2
	}
	return make(chan struct{}, n)
}()

// Broker starts a broker on a free loopback port with promptline's topics
// (partitions each), for this test: the embedded broker, or a node of
// Apache Kafka of its own when PROMPTLINE_TEST_KAFKA=apache (at most
// PROMPTLINE_TEST_KAFKA_JVMS at once per test binary; a test waits for a
// slot).
func Broker(tb testing.TB, partitions int32) *TestBroker {
	tb.Helper()
	topics := kafkautil.Topics{}.WithDefaults()
	if !ApacheKafkaEnabled() {
		start := func(addr string) (*kafkautil.Broker, error) {
			return kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: addr, Partitions: partitions, Topics: topics.All()})
		}
		b, err := start("127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { b.Close() })
		out := &TestBroker{addr: b.Addr(), close: b.Close}
		out.restart = func() error {
			back, err := start(out.addr)
			if err == nil {
				b = back
				out.close = back.Close
			}
			return err
		}
		return out
	}
	jvms <- struct{}{}
	tb.Cleanup(func() { <-jvms })
	k := StartApacheKafka(tb, 1)
	admin, err := sarama.NewClusterAdmin(k.Addrs(), kafkautil.NewConfig("testkit-topics"))
	must(tb, err)
	defer admin.Close()
	_, err = kafkautil.EnsureTopics(admin, topics, partitions, 1, nil)
	must(tb, err)
	return &TestBroker{addr: k.Addr(), close: k.Stop, restart: func() error {
		if err := k.StartNode(1); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), ApacheKafkaStartTimeout)
		defer cancel()
		return k.awaitMetadata(ctx)
	}}
}

// ReadAll returns every record of topic on the broker at addr, partition
// by partition, up to the high watermarks at the time of the call, through
// a plain Sarama consumer that commits nothing.
func ReadAll(tb testing.TB, addr, topic string) []*sarama.ConsumerMessage {
	tb.Helper()
	client, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("test-read"))
	must(tb, err)
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	must(tb, err)
	defer consumer.Close()
	partitions, err := client.Partitions(topic)
	must(tb, err)
	var out []*sarama.ConsumerMessage
	for _, p := range partitions {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		must(tb, err)
		if hwm == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		must(tb, err)
		timeout := time.NewTimer(30 * time.Second)
		for next := int64(0); next < hwm; {
			select {
			case m := <-pc.Messages():
				out = append(out, m)
				next = m.Offset + 1
			case err := <-pc.Errors():
				must(tb, err)
			case <-timeout.C:
				tb.Fatalf("reading %s/%d up to offset %d", topic, p, hwm)
			}
		}
		timeout.Stop()
		must(tb, pc.Close())
	}
	return out
}
