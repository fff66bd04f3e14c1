package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/pipeline"
)

const testPartitions = 4

// testBundle is a running promptline: admission, relay, executor and the
// consumer group, in this process, against a real Postgres database and
// the embedded broker over TCP.
type testBundle struct {
	pool     *pgxpool.Pool
	dbURL    string
	brokers  []string
	producer sarama.SyncProducer
	events   *topicReader
	rejects  *topicReader
}

type setupOpts struct {
	// wakes counts the wakes by result, as promptline_wakes_total does
	// (default: not counted).
	wakes *counts
	// maxSessions bounds the executor's sessions (default: the executor's).
	maxSessions int
	// noLocalWakes leaves out the consumer's WakesPartitions: every
	// prompt waits for its wake from Kafka.
	noLocalWakes bool
	// rejectsTopic names the rejects topic (default: prompts.rejects).
	rejectsTopic string
	// logs receives the log lines too (default: only the test's log).
	logs io.Writer
	// replies makes the consumer group consume permission-replies too.
	replies bool
}

func setup(t *testing.T, opts setupOpts) *testBundle {
	t.Helper()
	pool, dbURL := testkit.Pool(t)
	broker := testkit.Broker(t, testPartitions)
	brokers := []string{broker.Addr()}
	ctx, cancel := context.WithCancel(context.Background())

	cfg := kafkautil.NewConfig(t.Name())
	client, err := sarama.NewClient(brokers, cfg)
	require.NoError(t, err)
	producer, err := sarama.NewSyncProducerFromClient(client)
	require.NoError(t, err)

	var logw io.Writer = testWriter{t}
	if opts.logs != nil {
		logw = io.MultiWriter(logw, opts.logs)
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	relay := outbox.NewRelay(pool, producer, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Logger: log})
	require.NoError(t, relay.Start(ctx))
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{OnCommitFunc: relay.Nudge, Logger: log})
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: t.Name(), Logger: log})
	ecfg := &executor.ExecutorConfig{
		Claims: claims, OnCommitFunc: relay.Nudge, Logger: log, MaxSessions: opts.maxSessions,
	}
	ccfg := &pipeline.ConsumerConfig{Logger: log,
		Topics: kafkautil.Topics{Rejects: opts.rejectsTopic}}
	if opts.wakes != nil {
		ecfg.OnWakeFunc, ccfg.OnWakeFunc = opts.wakes.add, opts.wakes.add
	}
	if !opts.noLocalWakes {
		ccfg.WakesPartitions = kafkautil.PartitionCount(client, "wakes")
	}
	exec := executor.NewExecutor(pool, ecfg)
	handler := pipeline.NewConsumer(admitter, exec, producer, ccfg)

	group, err := sarama.NewConsumerGroup(brokers, "test", kafkautil.GroupConfig(cfg))
	require.NoError(t, err)
	topics := []string{"prompts", "wakes"}
	if opts.replies {
		topics = append(topics, "permission-replies")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = group.Consume(ctx, topics, handler)
		}
	}()

	b := &testBundle{pool: pool, dbURL: dbURL, brokers: brokers, producer: producer}
	b.events = readTopic(t, brokers, "session-events")
	if opts.rejectsTopic == "" { // a test naming one creates it when it wants
		b.rejects = readTopic(t, brokers, "prompts.rejects")
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		require.NoError(t, group.Close())
		exec.StopNow()
		relay.Stop()
		require.NoError(t, producer.Close())
		require.NoError(t, client.Close())
	})
	return b
}

// send publishes a prompt envelope with key = session.
func (b *testBundle) send(t *testing.T, p envelope.Prompt) {
	t.Helper()
	v, err := envelope.Marshal(p)
	require.NoError(t, err)
	b.sendRaw(t, []byte(p.SessionID), v)
}

func (b *testBundle) sendRaw(t *testing.T, key, value []byte) {
	t.Helper()
	m := &sarama.ProducerMessage{Topic: "prompts", Value: sarama.ByteEncoder(value)}
	if key != nil {
		m.Key = sarama.ByteEncoder(key)
	}
	_, _, err := b.producer.SendMessage(m)
	require.NoError(t, err)
}

// waitTurn waits for the turn event (completed or failed) answering msgID.
func (b *testBundle) waitTurn(t *testing.T, msgID string) envelope.Event {
	t.Helper()
	var found envelope.Event
	require.Eventually(t, func() bool {
		for _, e := range b.events.events(t) {
			if (e.Type == envelope.EventTurnCompleted || e.Type == envelope.EventTurnFailed) && contains(e.MessageIDs, msgID) {
				found = e
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "no turn event for %s", msgID)
	return found
}

// turnsFor counts distinct turns answering msgID (distinct by event id:
// the relay may publish an event twice).
func (b *testBundle) turnsFor(t *testing.T, msgID string) int {
	seen := map[string]bool{}
	for _, e := range b.events.events(t) {
		if (e.Type == envelope.EventTurnCompleted || e.Type == envelope.EventTurnFailed) && contains(e.MessageIDs, msgID) {
			seen[e.ID] = true
		}
	}
	return len(seen)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// topicReader collects every record of a topic, all partitions, from the
// oldest offset, through a plain Sarama consumer.
type topicReader struct {
	mu   sync.Mutex
	msgs []*sarama.ConsumerMessage
}

func readTopic(t *testing.T, brokers []string, topic string) *topicReader {
	t.Helper()
	c, err := sarama.NewConsumer(brokers, kafkautil.NewConfig(t.Name()+"-reader"))
	require.NoError(t, err)
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	r := &topicReader{}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		// A topic just created may have no leader for a moment (Apache
		// Kafka): the reader, like any client, tries again.
		var pc sarama.PartitionConsumer
		require.Eventually(t, func() bool {
			pc, err = c.ConsumePartition(topic, p, sarama.OffsetOldest)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "consuming %s/%d", topic, p)
		pcs = append(pcs, pc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range pc.Messages() {
				r.mu.Lock()
				r.msgs = append(r.msgs, m)
				r.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		c.Close()
	})
	return r
}

func (r *topicReader) all() []*sarama.ConsumerMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*sarama.ConsumerMessage(nil), r.msgs...)
}

func (r *topicReader) events(t *testing.T) []envelope.Event {
	var out []envelope.Event
	for _, m := range r.all() {
		e, err := envelope.DecodeEvent(m.Value)
		require.NoError(t, err)
		out = append(out, e)
	}
	return out
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// testWriter sends log lines to the test's log, shown on failure.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// id returns a message or session ID unique to this test.
func id(t *testing.T, what string) string {
	return fmt.Sprintf("%s-%s", strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()), what)
}

// counts counts what a callback reports, by label; safe for concurrent
// use (callbacks run on the executor's and the consumer's goroutines).
type counts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) add(label string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[label]++
}

func (c *counts) get(label string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[label]
}
