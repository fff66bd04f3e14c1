package testkit

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// TopicReader collects every record of a topic, all partitions, from the
// oldest offset, through a plain Sarama consumer that commits nothing,
// until the test ends. Unlike ReadAll, it keeps reading: a test waits on
// what arrives.
type TopicReader struct {
	mu      sync.Mutex
	msgs    []*sarama.ConsumerMessage
	arrived []time.Time
}

// TopicReaderOpts are the options of ReadTopic.
type TopicReaderOpts struct {
	// Config is the consumer's client configuration (TLS, SASL). Defaults
	// to kafkautil.NewConfig with the test's name and "-reader" as the
	// client ID.
	Config *sarama.Config
}

// ReadTopic starts a TopicReader of topic on brokers; it stops when the
// test ends.
func ReadTopic(tb testing.TB, brokers []string, topic string, opts *TopicReaderOpts) *TopicReader {
	tb.Helper()
	if opts == nil {
		opts = &TopicReaderOpts{}
	}
	cfg := opts.Config
	if cfg == nil {
		cfg = kafkautil.NewConfig(tb.Name() + "-reader")
	}
	c, err := sarama.NewConsumer(brokers, cfg)
	must(tb, err)
	r := &TopicReader{}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	tb.Cleanup(func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		if err := c.Close(); err != nil {
			tb.Errorf("closing the reader of %s: %v", topic, err)
		}
	})
	parts, err := c.Partitions(topic)
	must(tb, err)
	for _, p := range parts {
		// A topic just created may have no leader for a moment (Apache
		// Kafka): the reader, like any client, tries again.
		pc := consumePartition(tb, c, topic, p)
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				r.mu.Lock()
				r.msgs = append(r.msgs, m)
				r.arrived = append(r.arrived, time.Now())
				r.mu.Unlock()
			}
		})
		wg.Go(func() {
			for range pc.Errors() { // retried by Sarama (leader moves)
			}
		})
	}
	return r
}

// consumePartition consumes topic/p from the oldest offset, trying again
// for up to 30 seconds while the partition has no leader.
func consumePartition(tb testing.TB, c sarama.Consumer, topic string, p int32) sarama.PartitionConsumer {
	tb.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err == nil {
			return pc
		}
		select {
		case <-tick.C:
		case <-deadline:
			tb.Fatalf("consuming %s/%d: %v", topic, p, err)
		}
	}
}

// All returns the records read so far, in the order they arrived here
// (each partition's in offset order).
func (r *TopicReader) All() []*sarama.ConsumerMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// Since returns the records read after the first n.
func (r *TopicReader) Since(n int) []*sarama.ConsumerMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs[n:])
}

// Len is the number of records read so far.
func (r *TopicReader) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// Arrivals returns when each record of All arrived here.
func (r *TopicReader) Arrivals() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.arrived)
}

// Events decodes the records read so far as session events, duplicates
// included; a record that does not decode, or whose key is not its
// event's session, fails the test.
func (r *TopicReader) Events(tb testing.TB) []envelope.Event {
	tb.Helper()
	msgs := r.All()
	out := make([]envelope.Event, 0, len(msgs))
	for _, m := range msgs {
		e, err := envelope.DecodeEvent(m.Value)
		if err != nil {
			tb.Fatalf("session event %s: %v", m.Value, err)
		}
		if e.SessionID != string(m.Key) {
			tb.Fatalf("an event's key is its session: key %q, event %s", m.Key, m.Value)
		}
		out = append(out, e)
	}
	return out
}

// TurnEvents returns the turn events (completed or failed) answering
// msgID, duplicates included.
func (r *TopicReader) TurnEvents(tb testing.TB, msgID string) []envelope.Event {
	tb.Helper()
	var out []envelope.Event
	for _, e := range r.Events(tb) {
		if (e.Type == envelope.EventTurnCompleted || e.Type == envelope.EventTurnFailed) && slices.Contains(e.MessageIDs, msgID) {
			out = append(out, e)
		}
	}
	return out
}

// Turns counts the distinct turns answering msgID (distinct by event ID:
// the relay publishes at least once).
func (r *TopicReader) Turns(tb testing.TB, msgID string) int {
	tb.Helper()
	seen := map[string]bool{}
	for _, e := range r.TurnEvents(tb, msgID) {
		seen[e.ID] = true
	}
	return len(seen)
}

// WaitTurn waits up to timeout for the first turn event answering msgID
// and returns it.
func (r *TopicReader) WaitTurn(tb testing.TB, msgID string, timeout time.Duration) envelope.Event {
	tb.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for {
		if evs := r.TurnEvents(tb, msgID); len(evs) > 0 {
			return evs[0]
		}
		select {
		case <-tick.C:
		case <-deadline:
			tb.Fatalf("no turn event for %s within %v", msgID, timeout)
		}
	}
}

// Header returns the value of m's header key, or "" when it has none.
func Header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}
