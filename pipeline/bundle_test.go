package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"slices"
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
	producer sarama.SyncProducer // kafka's, for batches and other topics
	kafka    *testkit.KafkaClient
	events   *testkit.TopicReader
	rejects  *testkit.TopicReader
	handler  *pipeline.Consumer
	topics   []string // the topics the consumer group consumes
	// stopGroup stops the consumer group that setup started (nil with
	// setupOpts.noGroup); b.consume starts another.
	stopGroup func()

	mu        sync.Mutex
	groupErrs []error // what the consumer groups of b.consume returned (Errors)
}

type setupOpts struct {
	// wakes counts the wakes by result, as promptline_wakes_total does
	// (default: not counted).
	wakes *testkit.Counts
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
	// fairShare is the executor's FairShare (default: the executor's).
	fairShare time.Duration
	// maxBatch is the consumer's MaxBatch (default: the consumer's).
	maxBatch int
	// onAdmitted is the admitter's OnAdmittedFunc (default: none).
	onAdmitted func(outcomes []admission.Outcome, took time.Duration)
	// wakesPartitions is the consumer's WakesPartitions (default: the
	// wakes topic's partition count, unless noLocalWakes).
	wakesPartitions func() (int32, error)
	// wakeStarted receives the consumer's OnWakeStartedFunc (default: not
	// set).
	wakeStarted *wakeLatencies
	// noGroup leaves the consumer group unstarted: the test starts it
	// (b.consume) when what it needs is in the topics.
	noGroup bool
}

func setup(t *testing.T, opts setupOpts) *testBundle {
	t.Helper()
	pool, dbURL := testkit.Pool(t)
	broker := testkit.Broker(t, testPartitions)
	brokers := []string{broker.Addr()}
	kc := testkit.NewKafkaClient(t, brokers)
	log := testkit.Logger(t, opts.logs)

	relay := outbox.NewRelay(pool, kc.Producer, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Logger: log})
	require.NoError(t, relay.Start(t.Context()))
	t.Cleanup(relay.Stop)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{OnCommitFunc: relay.Nudge, OnAdmittedFunc: opts.onAdmitted})
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: t.Name(), Logger: log})
	ecfg := &executor.ExecutorConfig{
		Claims: claims, OnCommitFunc: relay.Nudge, Logger: log, MaxSessions: opts.maxSessions,
		FairShare: opts.fairShare,
	}
	ccfg := &pipeline.ConsumerConfig{Logger: log, MaxBatch: opts.maxBatch,
		Topics: kafkautil.Topics{Rejects: opts.rejectsTopic}}
	if opts.wakes != nil {
		ecfg.OnWakeFunc, ccfg.OnWakeFunc = opts.wakes.Add, opts.wakes.Add
	}
	if opts.wakeStarted != nil {
		ccfg.OnWakeStartedFunc = opts.wakeStarted.add
	}
	if !opts.noLocalWakes {
		ccfg.WakesPartitions = kafkautil.PartitionCount(kc.Client, "wakes")
		if opts.wakesPartitions != nil {
			ccfg.WakesPartitions = opts.wakesPartitions
		}
	}
	exec, err := executor.NewExecutor(pool, ecfg)
	require.NoError(t, err)
	require.NoError(t, exec.Start(context.Background()))
	t.Cleanup(exec.StopNow)
	handler := pipeline.NewConsumer(admitter, exec, kc.Producer, ccfg)

	topics := []string{"prompts", "wakes"}
	if opts.replies {
		topics = append(topics, "permission-replies")
	}
	b := &testBundle{pool: pool, dbURL: dbURL, brokers: brokers, producer: kc.Producer, kafka: kc, handler: handler, topics: topics}
	if !opts.noGroup {
		// Cleanups run last first: the group stops, then the executor, the
		// relay, and the producer they write through.
		b.stopGroup = b.consume(t)
	}
	b.events = testkit.ReadTopic(t, brokers, "session-events", nil)
	if opts.rejectsTopic == "" { // a test naming one creates it when it wants
		b.rejects = testkit.ReadTopic(t, brokers, "prompts.rejects", nil)
	}
	return b
}

// consume runs the consumer group "test" with b.handler until the stop it
// returns is called, or the test ends: its member leaves the group, so a
// later b.consume is assigned every partition at once.
func (b *testBundle) consume(t *testing.T) (stop func()) {
	t.Helper()
	g, err := sarama.NewConsumerGroup(b.brokers, "test", kafkautil.GroupConfig(b.kafka.Config))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			_ = g.Consume(ctx, b.topics, b.handler)
		}
	})
	errorsRead := make(chan struct{})
	go func() {
		defer close(errorsRead)
		for err := range g.Errors() { // closed by Close
			b.mu.Lock()
			b.groupErrs = append(b.groupErrs, err)
			b.mu.Unlock()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			if err := g.Close(); err != nil {
				t.Errorf("closing the consumer group: %v", err)
			}
			<-errorsRead
		})
	}
	t.Cleanup(stop)
	return stop
}

// groupErrors returns the errors the consumer groups of b.consume
// returned (the consumer logs them as warnings).
func (b *testBundle) groupErrors() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.groupErrs)
}

// send publishes a prompt envelope with key = session.
func (b *testBundle) send(t *testing.T, p envelope.Prompt) {
	t.Helper()
	b.kafka.SendPrompt(t, p)
}

func (b *testBundle) sendRaw(t *testing.T, key, value []byte) {
	t.Helper()
	b.kafka.Send(t, "prompts", key, value)
}

// waitTurn waits for the turn event (completed or failed) answering msgID.
func (b *testBundle) waitTurn(t *testing.T, msgID string) envelope.Event {
	t.Helper()
	return b.events.WaitTurn(t, msgID, 20*time.Second)
}

// turnsFor counts distinct turns answering msgID (distinct by event id:
// the relay may publish an event twice).
func (b *testBundle) turnsFor(t *testing.T, msgID string) int {
	t.Helper()
	return b.events.Turns(t, msgID)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

// id returns a message or session ID unique to this test.
func id(t *testing.T, what string) string {
	return fmt.Sprintf("%s-%s", strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()), what)
}

// wakeLatencies records what OnWakeStartedFunc is told.
type wakeLatencies struct {
	mu  sync.Mutex
	got []time.Duration
}

func (w *wakeLatencies) add(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, d)
}

func (w *wakeLatencies) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}
