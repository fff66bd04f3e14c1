package testkit

import (
	"testing"

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
