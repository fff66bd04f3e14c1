package ledger_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// docs/design.md, invariants 5 and 13: a write of an execution that fails with a
// transient error is retried behind the fence while the lease lives, once
// per write even when its commit's answer was lost, and never by an
// execution that lost its claim meanwhile.
func TestWriteRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		*testBundle // its claims go through the proxy
		proxy       *pgproxy.Proxy
		retries     atomic.Int32
		// beforeRetry, when set, runs before each retry.
		beforeRetry func()
		logs        testkit.LogBuffer
	}
	setupProxied := func(t *testing.T, lease time.Duration) *bundle {
		t.Helper()
		pool, proxy, ppool := proxiedPools(t, nil)
		b := &bundle{testBundle: &testBundle{pool: pool}, proxy: proxy}
		b.testBundle.claims = ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "owner-a", Logger: testkit.Logger(t, &b.logs), OnWriteRetryFunc: func() {
			b.retries.Add(1)
			if b.beforeRetry != nil {
				b.beforeRetry()
			}
		}})
		return b
	}
	// row is an outbox row the write adds, and landed finds it.
	row := outbox.Row{Topic: "t", Key: "s", Payload: []byte("once")}
	write := func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, row) }
	landed := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		var n int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE topic = 't' AND payload = 'once'`).Scan(&n)
		return n > 0, err
	}
	isWrite := func(label string) bool { return strings.Contains(label, "outbox") }

	t.Run("LostCommitIsWrittenAgain", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.proxy.CutBeforeCommit(isWrite)
		require.NoError(t, x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write))
		require.Equal(t, 1, b.proxy.Stats().CutsBefore)
		require.Equal(t, int32(1), b.retries.Load(), "counted")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`))
	})

	t.Run("AmbiguousCommitIsNotWrittenTwice", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.proxy.CutAfterCommit(isWrite)
		require.NoError(t, x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write))
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, int32(1), b.retries.Load())
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`), "written once")
		require.False(t, x.Fenced())
	})

	// The write committed with its release (nothing waited): the retry's
	// fence finds the claim gone, and the write there says it was this
	// release, not a lost claim.
	t.Run("AmbiguousFinishReportsItsRelease", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.proxy.CutAfterCommit(isWrite)
		released, err := x.FinishRetried(ctx, ledger.RetryOpts{Landed: landed}, write)
		require.NoError(t, err)
		require.True(t, released)
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.True(t, x.Fenced(), "a released execution writes no more")
	})

	t.Run("AmbiguousQueuedFinishKeepsTheClaimForWaitingInputs", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 1)
		x := b.acquire(t, "s", "e1")
		b.proxy.CutAfterCommit(isWrite)
		released, err := x.FinishQueuedRetried(ctx, ledger.RetryOpts{Landed: landed}, ledger.PhaseSafe, "", func(batch *pgx.Batch) {
			queueRow(batch, row)
		})
		require.NoError(t, err)
		require.False(t, released, "an input waits")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1' AND phase = 'safe'`))
		require.False(t, x.Fenced())
	})

	// The answer as one call (FinishCallRetried), its commit lost before it
	// was sent or after it was carried out, with or without an input
	// waiting: written once, released exactly when nothing waits, fenced
	// exactly when released. The retry runs the call in an explicit
	// transaction, whose own release then finds the claim as the call left
	// it.
	for _, c := range []struct {
		name    string
		waiting int
		after   bool
	}{{"CallLostBeforeCommitNothingWaits", 0, false}, {"CallLostBeforeCommitInputWaits", 1, false},
		{"CallAmbiguousNothingWaits", 0, true}, {"CallAmbiguousInputWaits", 1, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupProxied(t, 5*time.Second)
			b.session(t, "s", c.waiting)
			x := b.acquire(t, "s", "e1")
			answered := func(ctx context.Context, tx pgx.Tx) (bool, error) {
				var n int
				err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE payload = 'answer'`).Scan(&n)
				return n > 0, err
			}
			isCall := func(label string) bool { return strings.Contains(label, "promptline_turn_answer") }
			if c.after {
				b.proxy.CutAfterCommit(isCall)
			} else {
				b.proxy.CutBeforeCommit(isCall)
			}
			released, err := x.FinishCallRetried(ctx, ledger.RetryOpts{Landed: answered}, ledger.PhaseSafe, "", answerCall("none", "none"))
			require.NoError(t, err)
			require.Equal(t, int32(1), b.retries.Load())
			require.Equal(t, c.waiting == 0, released)
			require.Equal(t, c.waiting, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'safe'`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE payload = 'answer'`), "written once")
			require.Equal(t, released, x.Fenced())
		})
	}

	// A zombie: between its failed write and the retry, its claim expired
	// in the database's eyes and was taken over. The retry's fence refuses
	// it; it writes nothing and stops.
	t.Run("ZombieRetryIsFenced", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.beforeRetry = func() {
			b.expire(t, "s")
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				old, _, err := ledger.Get(ctx, tx, "s")
				if err != nil {
					return err
				}
				_, err = ledger.Takeover(ctx, tx, old, "e2", "recovery", time.Minute)
				return err
			}))
		}
		b.proxy.CutBeforeCommit(isWrite)
		err := x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write)
		require.ErrorIs(t, err, ledger.ErrFenced)
		require.True(t, x.Fenced())
		require.Equal(t, int32(1), b.retries.Load(), "one retry, refused by the fence")
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`), "the zombie wrote nothing")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e2'`))
	})

	// The same zombie at its last write: the claim was taken over while
	// the write that would have released it was lost. The retry's fence
	// finds the claim gone, the write is not there: fenced, not released.
	t.Run("ZombieFinishIsFenced", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.beforeRetry = func() {
			b.expire(t, "s")
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				old, _, err := ledger.Get(ctx, tx, "s")
				if err != nil {
					return err
				}
				_, err = ledger.Takeover(ctx, tx, old, "e2", "recovery", time.Minute)
				return err
			}))
		}
		b.proxy.CutBeforeCommit(isWrite)
		released, err := x.FinishRetried(ctx, ledger.RetryOpts{Landed: landed}, write)
		require.ErrorIs(t, err, ledger.ErrFenced)
		require.False(t, released, "the release was lost with the write")
		require.True(t, x.Fenced())
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`), "the zombie wrote nothing")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e2'`))
	})

	// The database stays away: the retries end with the lease as this
	// process counts it, which starts no later than acquire returned;
	// none starts after it, and the error goes to the caller.
	t.Run("RetriesEndWithTheLease", func(t *testing.T) {
		t.Parallel()
		const lease = time.Second
		b := setupProxied(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		acquired := time.Now()
		var mu sync.Mutex
		var tries []time.Time
		b.beforeRetry = func() {
			mu.Lock()
			defer mu.Unlock()
			tries = append(tries, time.Now())
		}
		b.proxy.Refuse(true)
		b.proxy.CutAll()
		began := time.Now()
		err := waitErr(t, func() error { return x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write) })
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "the database's error, not a fence: %v", err)
		mu.Lock()
		defer mu.Unlock()
		require.GreaterOrEqual(t, len(tries), 2, "retried while the lease lived")
		require.ErrorContains(t, err, fmt.Sprintf("tried %d times", len(tries)+1), "the error counts the first try and each retry")
		// The retries are spaced: at least half the backoff, 50 ms then
		// 100 ms, before each of the first two (a timer never fires early;
		// a lease of a second caps neither).
		require.GreaterOrEqual(t, tries[0].Sub(began), 25*time.Millisecond)
		require.GreaterOrEqual(t, tries[1].Sub(tries[0]), 50*time.Millisecond)
		// and each wait is drawn in [backoff/2, backoff): the warnings say
		// which (the first two: 50 ms, then 100 ms).
		var waits []time.Duration
		for _, m := range regexp.MustCompile(`retrying while the lease lives.* after=(\S+)`).FindAllStringSubmatch(b.logs.String(), -1) {
			d, err := time.ParseDuration(m[1])
			require.NoError(t, err)
			waits = append(waits, d)
		}
		require.GreaterOrEqual(t, len(waits), 2, b.logs.String())
		for i, backoff := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
			require.GreaterOrEqual(t, waits[i], backoff/2, "wait %d", i)
			require.Less(t, waits[i], backoff, "wait %d", i)
		}
		for _, at := range tries {
			require.True(t, at.Before(acquired.Add(lease)), "a retry %s after the lease's end", at.Sub(acquired.Add(lease)))
		}
		b.proxy.Refuse(false)
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 't'`))
		require.False(t, x.Fenced(), "not fenced: the claim is left to expire")
	})

	// With less than retryLastTry (20 ms) of the lease left, a transient
	// failure is not retried: a retry could not end before the lease
	// does. The lease is made to end 19 ms from now; the first try fails
	// at once (the proxy refuses connections), so the decision is taken
	// with less than that left, and on any machine the real code gives up.
	t.Run("NoRetryInTheLeaseLastMoments", func(t *testing.T) {
		t.Parallel()
		const lease = time.Second
		b := setupProxied(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		b.proxy.Refuse(true)
		b.proxy.CutAll()
		ledger.SetLeaseFrom(x, time.Now().Add(-lease+19*time.Millisecond))
		err := x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write)
		require.Error(t, err)
		require.ErrorContains(t, err, "tried 1 times; the lease ends before another retry")
		require.Zero(t, b.retries.Load(), "no retry")
		require.Contains(t, b.logs.String(), "the lease ends before a retry")
	})

	// A retry that the database leaves hanging ends with the lease too:
	// the executor never waits on a write that would reach the database
	// after its lease.
	t.Run("HangingRetryEndsWithTheLease", func(t *testing.T) {
		t.Parallel()
		const lease = time.Second
		b := setupProxied(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		acquired := time.Now()
		b.beforeRetry = func() { b.proxy.SetLatency(10 * time.Second) }
		b.proxy.CutBeforeCommit(isWrite)
		err := waitErr(t, func() error { return x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, write) })
		require.Error(t, err)
		require.Less(t, time.Since(acquired), lease+3*time.Second, "the retry outlived the lease")
		b.proxy.SetLatency(0)
	})

	// Cancelled (shutdown) while it retries: no further try; the error
	// goes to the caller and the claim is left to expire.
	t.Run("CancelledStopsRetrying", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 30*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		b.beforeRetry = cancel
		b.proxy.Refuse(true)
		b.proxy.CutAll()
		err := waitErr(t, func() error { return x.WriteRetried(cctx, ledger.RetryOpts{Landed: landed}, write) })
		require.Error(t, err)
		require.Equal(t, int32(1), b.retries.Load(), "no retry after the cancellation")
		require.False(t, x.Fenced())
	})

	// A deterministic error is not retried.
	t.Run("DataErrorIsNotRetried", func(t *testing.T) {
		t.Parallel()
		b := setupProxied(t, 5*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		err := x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			return err
		})
		require.Error(t, err)
		require.False(t, pgdb.Transient(err))
		require.Zero(t, b.retries.Load())
	})
}

// waitErr runs fn and returns its error; a retry loop that does not end
// within 20 seconds fails the test (every lease here is shorter).
func waitErr(t *testing.T, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the write is still retrying after 20 s")
		return nil
	}
}

// After a try in doubt, a last refusal is not returned as one. A caller
// may take a refusal for "nothing committed" and write again under a new
// position (the executor did so, retryRefused, until its writes under a
// claim were left to this loop alone); a try still committing on the server,
// holding the claim's row (which is what times the next fences out), would
// then pass its own fence beside that new write: a second turn promoted
// while the first one's intent stands. Here another transaction holds the
// claim's row, so that every fence after it waits past lock_timeout, and
// the write's context ends during the backoff after its second refusal,
// so that a refusal is the last error.
func TestRefusalAfterATryInDoubtIsNotARefusal(t *testing.T) {
	t.Parallel()
	for _, doubt := range []bool{true, false} {
		t.Run(fmt.Sprintf("InDoubt=%t", doubt), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool, proxy, ppool := proxiedPools(t, map[string]string{"lock_timeout": "100"})
			var once sync.Once
			hold := func() {
				once.Do(func() {
					tx, err := pool.Begin(context.Background())
					require.NoError(t, err)
					t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
					_, err = tx.Exec(context.Background(), `SELECT 1 FROM claims WHERE session_id = 's' FOR UPDATE`)
					require.NoError(t, err)
				})
			}
			refusals := &cancelAfterRetries{n: 2, cancel: cancel, Handler: slog.DiscardHandler}
			b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: 10 * time.Second, OwnerID: "owner-a",
				Logger: slog.New(refusals), OnWriteRetryFunc: hold})}
			b.session(t, "s", 0)
			x := b.acquire(t, "s", "e1")
			if doubt {
				// The first try's commit is cut: the client cannot tell
				// whether it committed. The row is held from its first retry.
				proxy.CutBeforeCommit(func(label string) bool { return strings.Contains(label, "promptline_fence(") })
			} else {
				hold() // the first try is refused too: nothing is in doubt
			}
			err := x.WriteRetried(ctx, ledger.RetryOpts{}, func(pgx.Tx) error { return nil })
			require.Error(t, err)
			require.Contains(t, refusals.last.Load(), "SQLSTATE 55P03", "the last try was refused")
			if doubt {
				require.Equal(t, 1, proxy.Stats().CutsBefore)
				require.False(t, pgdb.Refused(err), "not a refusal after a try in doubt: %v", err)
				require.ErrorContains(t, err, "may have committed")
			} else {
				require.True(t, pgdb.Refused(err), "a refusal, when every try was refused: %v", err)
			}
		})
	}
}

// cancelAfterRetries calls cancel when the n-th retry of a write is
// announced ("write failed transiently; retrying"), which comes just
// before the retry's backoff, and keeps the last error announced.
type cancelAfterRetries struct {
	slog.Handler
	n, seen int
	cancel  func()
	last    atomic.Value
}

func (h *cancelAfterRetries) Enabled(context.Context, slog.Level) bool { return true }

func (h *cancelAfterRetries) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "write failed transiently; retrying") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			h.last.Store(a.Value.String())
		}
		return true
	})
	if h.seen++; h.seen == h.n {
		h.cancel()
	}
	return nil
}
