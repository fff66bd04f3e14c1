package admission

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// A combined transaction runs under the latest deadline of its batches'
// tries, not the first batch's: a try that waited in the queue close to
// its bound cut every batch in the transaction short, and under a
// sustained overload each partition's retry met the same fate.
func TestAdmitGroupRunsUnderTheLatestDeadline(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	ctx := context.Background()
	g := NewGroup(NewAdmitter(pool, &AdmitterConfig{}), 1000, nil)
	prompt := func(msg, sess string) Incoming {
		return Incoming{Prompt: envelope.Prompt{MessageID: msg, SessionID: sess, Text: "x"}}
	}
	for _, s := range []string{"blocked", "slow"} {
		_, err := g.Admit(ctx, []Incoming{prompt("m-"+s, s)})
		require.NoError(t, err)
		waitIdle(t, g)
	}

	// "blocked" holds the queue: maxAdmitInFlight transactions wait on it.
	lock := func(session string) pgx.Tx {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, session)
		require.NoError(t, err)
		return tx
	}
	blocked, slow := lock("blocked"), lock("slow")
	held := make(chan error, maxAdmitInFlight)
	for i := range maxAdmitInFlight {
		go func() {
			_, err := g.Admit(ctx, []Incoming{prompt(fmt.Sprintf("b%d", i), "blocked")})
			held <- err
		}()
		require.Eventually(t, func() bool {
			queued, running := g.queue.State()
			return running == i+1 && queued == 0
		}, 5*time.Second, time.Millisecond)
	}

	// Queued: a try with little time left, then one with plenty; the
	// second's batch waits on "slow", which outlasts the first's deadline.
	type result struct {
		out []Outcome
		err error
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	long, cancelLong := context.WithTimeout(ctx, time.Minute)
	defer cancelLong()
	results := make([]chan result, 2)
	for i, q := range []struct {
		ctx   context.Context
		batch []Incoming
	}{
		{short, []Incoming{prompt("q1", "s1")}},
		{long, []Incoming{prompt("q2", "slow")}},
	} {
		results[i] = make(chan result, 1)
		go func() {
			out, err := g.Admit(q.ctx, q.batch)
			results[i] <- result{out, err}
		}()
		require.Eventually(t, func() bool {
			queued, _ := g.queue.State()
			return queued == i+1
		}, 5*time.Second, time.Millisecond)
	}
	require.NoError(t, blocked.Rollback(ctx))
	for range maxAdmitInFlight {
		require.NoError(t, <-held)
	}
	// The combined transaction now waits on "slow" past the short try's
	// deadline, and neither batch has an answer: under the first batch's
	// deadline the transaction was given up there and both failed.
	<-short.Done()
	require.Never(t, func() bool { return len(results[0]) > 0 || len(results[1]) > 0 },
		300*time.Millisecond, 5*time.Millisecond, "the combined transaction was given up at the short try's deadline")
	require.NoError(t, slow.Rollback(ctx))
	for i, want := range [][]Outcome{{Admitted}, {Admitted}} {
		r := <-results[i]
		require.NoError(t, r.err, "batch %d", i)
		require.Equal(t, want, r.out, "batch %d", i)
	}
	require.Equal(t, int64(2+maxAdmitInFlight+1), g.transactions.Load(), "the two queued batches were one transaction")
}

func TestLatestDeadline(t *testing.T) {
	t.Parallel()
	base := context.Background()
	at := func(d time.Duration) context.Context {
		ctx, cancel := context.WithDeadline(base, time.Now().Add(d))
		t.Cleanup(cancel)
		return ctx
	}
	soon, later, latest := at(time.Minute), at(2*time.Minute), at(3*time.Minute)
	for _, c := range []struct {
		name string
		ctxs []context.Context
		want context.Context
	}{
		{"one", []context.Context{soon}, soon},
		{"last", []context.Context{soon, later, latest}, latest},
		{"first", []context.Context{latest, soon, later}, latest},
		{"middle", []context.Context{soon, latest, later}, latest},
		{"unbounded first", []context.Context{base, latest}, base},
		{"unbounded later", []context.Context{soon, base, latest}, base},
	} {
		reqs := make([]*admitRequest, len(c.ctxs))
		for i, ctx := range c.ctxs {
			reqs[i] = &admitRequest{ctx: ctx}
		}
		require.True(t, latestDeadline(reqs) == c.want, c.name)
	}
}
