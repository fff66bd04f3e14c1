package kafkautil_test

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// rejectBundle is a RejectPublisher on the embedded broker, over TCP, with
// the outcomes it reported.
type rejectBundle struct {
	broker    *kafkautil.Broker
	publisher *kafkautil.RejectPublisher
	logs      *testkit.SyncBuffer

	mu       sync.Mutex
	outcomes map[string]string // reason → outcome
}

func setupRejects(t *testing.T) *rejectBundle {
	t.Helper()
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", Partitions: 1, Topics: []string{"prompts.rejects"}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	producer, err := sarama.NewSyncProducer([]string{b.Addr()}, kafkautil.NewConfig(t.Name()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, producer.Close()) })
	rb := &rejectBundle{broker: b, logs: testkit.NewSyncBuffer(), outcomes: map[string]string{}}
	rb.publisher = &kafkautil.RejectPublisher{Producer: producer, Logger: testkit.Logger(t, rb.logs),
		OnPublishedFunc: func(reason, outcome, _ string) {
			rb.mu.Lock()
			defer rb.mu.Unlock()
			rb.outcomes[reason] = outcome
		}}
	return rb
}

func (rb *rejectBundle) outcome(reason string) string {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.outcomes[reason]
}

// refuseKeyless makes the embedded broker refuse a record batch holding a
// record without a key on topic, as Apache Kafka refuses it on a topic with
// cleanup.policy=compact: INVALID_RECORD, which Kafka defines as not
// retriable. kfake keeps keyless records on compacted topics.
func refuseKeyless(c *kfake.Cluster, topic string) *kfake.FaultHandle {
	return c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.InvalidRecord, Count: -1,
		When: func(req kmsg.Request) bool {
			for _, rt := range req.(*kmsg.ProduceRequest).Topics {
				for _, rp := range rt.Partitions {
					if rt.Topic == topic && hasKeylessRecord(rp.Records) {
						return true
					}
				}
			}
			return false
		}})
}

// hasKeylessRecord reports whether an uncompressed record batch (Sarama
// compresses nothing by default) holds a record with a null key.
func hasKeylessRecord(batch []byte) bool {
	var b kmsg.RecordBatch
	if b.ReadFrom(batch) != nil {
		return false
	}
	for rest := b.Records; len(rest) > 0; {
		length, n := binary.Varint(rest)
		if n <= 0 || int(length) > len(rest)-n {
			return false
		}
		var r kmsg.Record
		if r.ReadFrom(rest[:n+int(length)]) != nil {
			return false
		}
		if r.Key == nil {
			return true
		}
		rest = rest[n+int(length):]
	}
	return false
}

// TestRejectRefusedForGoodIsDropped: a reject the broker refuses for what
// it is (here a keyless reject on a compacted rejects topic: INVALID_RECORD)
// is refused by every retry; it was retried without end, and the partition
// behind it stopped for good (P6). It is dropped as reject_unpublished, as
// one too large even without its value is; a reject sent with it, refused
// only for its company, is published.
func TestRejectRefusedForGoodIsDropped(t *testing.T) {
	t.Parallel()
	rb := setupRejects(t)
	refuseKeyless(rb.broker.Cluster(), "prompts.rejects")

	keyless := kafkautil.RejectMessage("prompts.rejects",
		&sarama.ConsumerMessage{Topic: "prompts", Offset: 7, Value: []byte("{")}, "invalid_json", "keyless")
	keyed := kafkautil.RejectMessage("prompts.rejects",
		&sarama.ConsumerMessage{Topic: "prompts", Offset: 8, Key: []byte("s"), Value: []byte("[]")}, "keyed", "keyed")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	require.NoError(t, rb.publisher.Publish(ctx, []*sarama.ProducerMessage{keyless, keyed}), "the publish returned")

	require.Equal(t, "reject_unpublished", rb.outcome("invalid_json"))
	require.Equal(t, "rejected", rb.outcome("keyed"))
	require.Contains(t, rb.logs.String(), "source_offset=7", "the dropped reject's source is logged")
	rejects := testkit.ReadAll(t, rb.broker.Addr(), "prompts.rejects")
	require.Len(t, rejects, 1)
	require.Equal(t, "keyed", testkit.Header(rejects[0], "reason"))
}

// TestRejectPublishReturnsWhenItsContextEnds: a rebalance ends the
// session's context, and a partition's handler must return within the
// rebalance timeout (60s). A rejects topic that does not answer held
// Publish, in Sarama's SendMessages, for Sarama's whole retry budget (ten
// retries of a request unanswered for 15s), whatever its context said.
// Publish now returns when its context ends, without counting the reject
// as published: the caller does not mark its offset, and the partition's
// next owner rejects the message again.
func TestRejectPublishReturnsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	rb := setupRejects(t)
	c := rb.broker.Cluster()
	release, held := make(chan struct{}), make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case held <- struct{}{}:
		default:
		}
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	defer close(release) // before the producer and the broker close

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	reject := kafkautil.RejectMessage("prompts.rejects",
		&sarama.ConsumerMessage{Topic: "prompts", Key: []byte("s"), Value: []byte("{")}, "invalid_json", "d")
	done := make(chan error, 1)
	go func() { done <- rb.publisher.Publish(ctx, []*sarama.ProducerMessage{reject}) }()
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the reject was never produced")
	}
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("Publish held on after its context ended")
	}
	require.Empty(t, rb.outcome("invalid_json"), "not counted: the next owner rejects it again")
}
