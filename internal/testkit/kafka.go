package testkit

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
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

// KafkaClient is a test's client of the broker: a Sarama client and a
// synchronous producer on it, closed when the test ends (after the
// cleanups registered later, which may still produce).
type KafkaClient struct {
	// Config is the client's configuration, as the consumer builds its own
	// (kafkautil.NewConfig), with the test's name as the client ID.
	Config   *sarama.Config
	Brokers  []string
	Client   sarama.Client
	Producer sarama.SyncProducer
}

// NewKafkaClient connects a KafkaClient to brokers.
func NewKafkaClient(tb testing.TB, brokers []string) *KafkaClient {
	tb.Helper()
	cfg := kafkautil.NewConfig(tb.Name())
	client, err := sarama.NewClient(brokers, cfg)
	must(tb, err)
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		client.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := producer.Close(); err != nil {
			tb.Errorf("closing the producer: %v", err)
		}
		if err := client.Close(); err != nil {
			tb.Errorf("closing the client: %v", err)
		}
	})
	return &KafkaClient{Config: cfg, Brokers: brokers, Client: client, Producer: producer}
}

// SendPrompt publishes a prompt envelope on prompts with key = session.
func (k *KafkaClient) SendPrompt(tb testing.TB, p envelope.Prompt) {
	tb.Helper()
	v, err := envelope.Marshal(p)
	must(tb, err)
	k.Send(tb, "prompts", []byte(p.SessionID), v)
}

// Send publishes value on topic with key (none when nil).
func (k *KafkaClient) Send(tb testing.TB, topic string, key, value []byte) {
	tb.Helper()
	m := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(value)}
	if key != nil {
		m.Key = sarama.ByteEncoder(key)
	}
	_, _, err := k.Producer.SendMessage(m)
	must(tb, err)
}

// ConsumeGroup runs handler as member of the consumer group on topics,
// joining again after each rebalance, until the test ends; the group is
// closed before the cleanups registered earlier run (those that stop
// what handler calls).
func (k *KafkaClient) ConsumeGroup(tb testing.TB, group string, topics []string, handler sarama.ConsumerGroupHandler) {
	tb.Helper()
	g, err := sarama.NewConsumerGroup(k.Brokers, group, kafkautil.GroupConfig(k.Config))
	must(tb, err)
	ctx := tb.Context() // canceled before the cleanups run
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			_ = g.Consume(ctx, topics, handler)
		}
	})
	tb.Cleanup(func() {
		wg.Wait()
		if err := g.Close(); err != nil {
			tb.Errorf("closing the consumer group: %v", err)
		}
	})
}
