package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/pipeline"
)

// When the assignment ends (a rebalance, or the group stopping), the runs
// of the sessions on the wakes partitions it took away stop after their
// current turn and release with a wake, which the partitions' next owner
// consumes: a run does not go on for a partition this process no longer
// holds.
func TestEndOfAssignmentHandsTheRunsOn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	long := id(t, "long")
	const n = 12 // 3.6 s of turns
	var sent []string
	for i := range n {
		msg := fmt.Sprintf("%s-%d", long, i)
		sent = append(sent, msg)
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: long, Text: "/sleep 300ms", Delivery: envelope.DeliveryQueue})
	}
	require.Equal(t, envelope.EventTurnCompleted, b.events.WaitTurn(t, sent[0], 20*time.Second).Type)
	b.stopGroup() // the assignment ends: Cleanup

	released := `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1 AND convert_from(payload, 'UTF8')::jsonb ->> 'reason' = 'released'`
	require.Eventually(t, func() bool { return b.count(t, released, long) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the run did not hand its session on when its partition went")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, long))
	require.Less(t, b.events.Turns(t, sent[n-1]), 1, "the run ended before the assignment did: the test proved nothing")

	// The partitions' next owner (this process again) runs the rest from
	// the release's wake, under a new execution.
	b.consume(t)
	for _, msg := range sent {
		require.Equal(t, envelope.EventTurnCompleted, b.events.WaitTurn(t, msg, 30*time.Second).Type, msg)
	}
	require.Equal(t, 2, b.count(t, `SELECT count(DISTINCT execution_id) FROM messages WHERE session_id = $1 AND role = 'assistant'`, long))
}

// A wakes topic that reports no partitions (a topic being created) is a
// partition count unknown: prompts wait for their wakes from Kafka, as
// when the count cannot be read, and the partition is not computed
// modulo zero.
func TestNoWakesPartitionsMeansNoLocalWakes(t *testing.T) {
	t.Parallel()
	wakes := &testkit.Counts{}
	b := setup(t, setupOpts{wakes: wakes, wakesPartitions: func() (int32, error) { return 0, nil }})
	msg := id(t, "m")
	b.send(t, envelope.Prompt{MessageID: msg, SessionID: id(t, "s"), Text: "hello"})
	require.Equal(t, "echo: hello", b.waitTurn(t, msg).Text)
	require.Zero(t, wakes.Get("local"))
	require.Equal(t, 1, wakes.Get("started"))
}

// MaxBatch bounds the prompts of one admission transaction, however many
// a partition has at hand.
func TestMaxBatchBoundsAnAdmission(t *testing.T) {
	t.Parallel()
	const maxBatch = 2
	var mu sync.Mutex
	var sizes []int
	b := setup(t, setupOpts{maxBatch: maxBatch, noGroup: true,
		onAdmitted: func(outcomes []admission.Outcome, _ time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(outcomes))
		}})
	// Every prompt is in the partition before the group starts: the
	// consumer finds a backlog, and takes as much of it as a batch holds.
	sess := id(t, "s")
	const n = 7
	var sent []string
	for i := range n {
		msg := fmt.Sprintf("%s-%d", id(t, "m"), i)
		sent = append(sent, msg)
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "hi", Delivery: envelope.DeliveryQueue})
	}
	b.consume(t)
	for _, msg := range sent {
		require.Equal(t, envelope.EventTurnCompleted, b.events.WaitTurn(t, msg, 20*time.Second).Type, msg)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, n, sum(sizes), "transactions %v", sizes)
	require.Equal(t, maxBatch, slices.Max(sizes), "transactions %v: no batch was full, or one was larger", sizes)
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// A consumer without an executor (the admission benchmark's: it consumes
// prompts only) admits them and ends its assignment without a run to
// revoke.
func TestAdmissionOnlyConsumer(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	broker := testkit.Broker(t, testPartitions)
	brokers := []string{broker.Addr()}
	kc := testkit.NewKafkaClient(t, brokers)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})
	handler := pipeline.NewConsumer(admitter, nil, kc.Producer, &pipeline.ConsumerConfig{Logger: testkit.Logger(t, nil)})

	g, err := sarama.NewConsumerGroup(brokers, "test", kafkautil.GroupConfig(kc.Config))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	consumed := make(chan error, 1)
	go func() { consumed <- g.Consume(ctx, []string{"prompts"}, handler) }()
	kc.SendPrompt(t, envelope.Prompt{MessageID: id(t, "m"), SessionID: id(t, "s"), Text: "hi"})
	require.Eventually(t, func() bool {
		return testkit.Count(t, pool, `SELECT count(*) FROM inputs WHERE message_id = $1`, id(t, "m")) == 1
	}, 20*time.Second, 10*time.Millisecond, "the prompt is admitted")
	cancel() // the assignment ends: Cleanup
	<-consumed
	require.NoError(t, g.Close())
	require.Equal(t, 1, testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`), "its wake waits for a relay")
}

// An admission that the end of the assignment cuts off (a rebalance or a
// stop while it waits for Postgres) is no error of the consumer group,
// which the consumer would log as a warning: the prompt is redelivered to
// the partition's next owner, and admitted then.
func TestAdmissionCutOffByTheEndOfTheAssignmentIsNoError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	sess, msg := id(t, "s"), id(t, "m")

	// Hold the session's row: admission upserts it, so it waits for us.
	_, err := b.pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1)`, sess)
	require.NoError(t, err)
	locker, err := pgx.Connect(ctx, b.dbURL)
	require.NoError(t, err)
	defer locker.Close(ctx)
	lock, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, sess)
	require.NoError(t, err)

	b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "cut off"})
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, locker.PgConn().PID()) > 0
	}, 20*time.Second, 10*time.Millisecond, "no admission waits for the session row")
	b.stopGroup()
	require.Empty(t, b.groupErrors())
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msg))

	require.NoError(t, lock.Rollback(ctx))
	b.consume(t)
	require.Equal(t, "echo: cut off", b.waitTurn(t, msg).Text)
	require.Equal(t, 1, b.turnsFor(t, msg))
}
