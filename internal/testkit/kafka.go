package testkit

import (
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/kafkautil"
)

// Broker starts the embedded broker on a free loopback port with
// promptline's topics, for this test.
func Broker(tb testing.TB, partitions int32) *kafkautil.Broker {
	tb.Helper()
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{
		Addr: "127.0.0.1:0", Partitions: partitions, Topics: kafkautil.Topics{}.WithDefaults().All(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.Close)
	return b
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
