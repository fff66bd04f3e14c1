package admission

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/outbox"
)

// Batches of several partitions that wait while an admission transaction
// runs are admitted together in the next one, each getting its own
// outcomes, classified as if the batches had come one after the other.
func TestAdmitGroupCombinesWaitingBatches(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	ctx := context.Background()
	var wakes []string
	var mu sync.Mutex
	g := NewGroup(NewAdmitter(pool, &AdmitterConfig{}), 3, func(w []outbox.Row) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range w {
			wakes = append(wakes, r.Key)
		}
	})
	prompt := func(msg, sess, text string) Incoming {
		return Incoming{Prompt: envelope.Prompt{MessageID: msg, SessionID: sess, Text: text}}
	}
	_, err := g.Admit(ctx, []Incoming{prompt("m0", "blocked", "first")})
	require.NoError(t, err)
	require.Equal(t, int64(1), g.transactions.Load())
	waitIdle(t, g)

	// Hold the session row: the next two transactions (maxAdmitInFlight)
	// wait on it, and what comes after them queues.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'blocked' FOR UPDATE`)
	require.NoError(t, err)

	type result struct {
		out []Outcome
		err error
	}
	batches := [][]Incoming{
		{prompt("b1", "blocked", "one")},
		{prompt("b2", "blocked", "two")},
		// Queued behind them: three partitions' batches, four prompts, so
		// maxBatch (3) splits them in two transactions.
		{prompt("q1", "s1", "x"), prompt("q2", "s2", "y")},
		{prompt("q1", "s1", "x"), prompt("m0", "blocked", "other payload")},
		{prompt("q3", "s3", "z")},
	}
	results := make([]chan result, len(batches))
	for i, b := range batches {
		results[i] = make(chan result, 1)
		go func() {
			out, err := g.Admit(ctx, b)
			results[i] <- result{out, err}
		}()
		require.Eventually(t, func() bool {
			queued, running := g.queue.State()
			if i < 2 {
				return running == i+1 && queued == 0
			}
			return queued == i-1
		}, 5*time.Second, time.Millisecond)
	}
	require.NoError(t, tx.Rollback(ctx))

	want := [][]Outcome{
		{Admitted},
		{Admitted},
		{Admitted, Admitted},
		{Duplicate, Conflict},
		{Admitted},
	}
	got := make([][]Outcome, len(batches))
	for i := range batches {
		r := <-results[i]
		require.NoError(t, r.err)
		got[i] = r.out
	}
	// q1 comes in batches 2 and 3, which two transactions may admit at
	// once (maxAdmitInFlight): exactly one of them admits it, whichever
	// commits first. (One partition never has two batches in flight.)
	require.ElementsMatch(t, []Outcome{Admitted, Duplicate}, []Outcome{got[2][0], got[3][0]}, "q1: %v", got)
	got[2][0], got[3][0] = Admitted, Duplicate
	require.Equal(t, want, got)
	// 1 before, 2 that waited on the lock, 2 for the three queued batches.
	require.Equal(t, int64(5), g.transactions.Load())
	require.ElementsMatch(t, []string{"blocked", "blocked", "blocked", "s1", "s2", "s3"}, wakes)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inputs`).Scan(&n))
	require.Equal(t, 6, n)
}

// A batch of soloBatch prompts or more is admitted at once, in a
// transaction of its own, even while maxAdmitInFlight combined
// transactions run and hold the queue: it amortises its transaction
// already, and waiting behind the others would only take parallelism away.
func TestAdmitGroupAdmitsAFullBatchAtOnce(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	ctx := context.Background()
	g := NewGroup(NewAdmitter(pool, &AdmitterConfig{}), 1000, nil)
	prompt := func(msg, sess, text string) Incoming {
		return Incoming{Prompt: envelope.Prompt{MessageID: msg, SessionID: sess, Text: text}}
	}
	_, err := g.Admit(ctx, []Incoming{prompt("m0", "blocked", "first")})
	require.NoError(t, err)
	waitIdle(t, g)

	// Hold the session row: the next two transactions wait on it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'blocked' FOR UPDATE`)
	require.NoError(t, err)
	held := make(chan error, 2)
	for i := range maxAdmitInFlight {
		go func() {
			_, err := g.Admit(ctx, []Incoming{prompt(fmt.Sprintf("b%d", i), "blocked", "held")})
			held <- err
		}()
		require.Eventually(t, func() bool {
			queued, running := g.queue.State()
			return running == i+1 && queued == 0
		}, 5*time.Second, time.Millisecond)
	}

	full := make([]Incoming, soloBatch)
	for i := range full {
		full[i] = prompt(fmt.Sprintf("f%d", i), fmt.Sprintf("s%d", i), "full")
	}
	done := make(chan error, 1)
	go func() {
		_, err := g.Admit(ctx, full)
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err, "the full batch was admitted while the others waited")
	case <-time.After(20 * time.Second):
		t.Fatal("a batch of soloBatch prompts waited behind the transactions in flight")
	}
	require.NoError(t, tx.Rollback(ctx))
	for range maxAdmitInFlight {
		require.NoError(t, <-held)
	}
}

// waitIdle waits until g's queue holds nothing and no flush runs. Admit
// returns when its batch's outcomes are set, before the flushing goroutine
// looks at the queue again and ends: a test that counts the flushes
// running must first see that one end, or it counts it as one of its own,
// and that goroutine may then take the test's next batches as one group.
func waitIdle(t *testing.T, g *Group) {
	t.Helper()
	require.Eventually(t, func() bool {
		queued, running := g.queue.State()
		return queued == 0 && running == 0
	}, 5*time.Second, time.Millisecond)
}
