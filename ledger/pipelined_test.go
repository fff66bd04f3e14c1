package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// The queued writes send a whole transaction in one round trip; these tests
// hold them to the promises of Acquire, Write and Finish.
func TestQueuedWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AcquireWaitingClaimsOnlyWhenInputWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "idle", 0)
		_, err := b.claims.AcquireWaiting(ctx, "idle", "e0", nil)
		require.ErrorIs(t, err, ledger.ErrNothingWaiting)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "no claim without input")
		require.Zero(t, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 'idle'`), "no token spent")

		b.session(t, "s", 1)
		var seen int
		x, err := b.claims.AcquireWaiting(ctx, "s", "e1", func(batch *pgx.Batch) {
			// Runs after the claim, in its transaction.
			batch.Queue(`SELECT count(*) FROM claims WHERE session_id = 's' AND execution_id = 'e1'`).
				QueryRow(func(row pgx.Row) error { return row.Scan(&seen) })
		})
		require.NoError(t, err)
		require.Equal(t, 1, seen, "the reads see the claim")
		require.Equal(t, int64(1), x.Claim().Token)
		require.Equal(t, 1, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "the session remembers the token")

		_, err = b.claims.AcquireWaiting(ctx, "s", "e2", nil)
		require.ErrorIs(t, err, ledger.ErrClaimHeld)
		require.Equal(t, 1, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "a refused claim spends no token")

		_, err = b.claims.AcquireWaiting(ctx, "missing", "e3", nil)
		require.ErrorContains(t, err, "does not exist")
	})

	t.Run("FencedQueuedWriteRollsBackEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		x, err := b.claims.AcquireWaiting(ctx, "s", "e1", nil)
		require.NoError(t, err)
		require.NoError(t, x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
			queueRow(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("live")})
		}))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox`))

		b.expire(t, "s")
		err = x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
			queueRow(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("zombie")})
		})
		require.ErrorIs(t, err, ledger.ErrFenced)
		require.True(t, x.Fenced())
		require.Error(t, x.Context().Err(), "a fenced execution's context ends")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox`), "nothing behind the fence was written")

		_, err = x.FinishQueued(ctx, "", "", func(*pgx.Batch) {})
		require.ErrorIs(t, err, ledger.ErrFenced, "and every later write is refused")
	})

	t.Run("AStatementErrorRollsBackTheFenceAndTheRest", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		x, err := b.claims.AcquireWaiting(ctx, "s", "e1", nil)
		require.NoError(t, err)
		params := ledger.AttemptParams{ID: "e1/step-1", Step: 1, Provider: "p", IdempotencyKey: "k", RequestHash: []byte{1}}
		require.NoError(t, x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) { x.QueueBeginAttempt(batch, params) }))
		err = x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
			queueRow(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("x")})
			x.QueueBeginAttempt(batch, params) // the same attempt again: a key violation
		})
		require.Error(t, err)
		require.NotErrorIs(t, err, ledger.ErrFenced)
		require.False(t, x.Fenced())
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`), "the outbox row before the failing statement rolled back")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts`))
	})

	t.Run("FinishQueuedReleasesOnlyWhenNothingWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		x, err := b.claims.AcquireWaiting(ctx, "s", "e1", nil)
		require.NoError(t, err)
		b.exec(t, `UPDATE inputs SET promotion_seq = 1 WHERE session_id = 's'`)
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('later', 's', 'x', '\x00', 'queue', true)`)
		released, err := x.FinishQueued(ctx, ledger.PhaseSafe, "", func(*pgx.Batch) {})
		require.NoError(t, err)
		require.False(t, released, "an input waits: the claim stays for it")
		require.Equal(t, "safe", b.phase(t, "s"))

		b.exec(t, `UPDATE inputs SET promotion_seq = 2 WHERE message_id = 'later'`)
		released, err = x.FinishQueued(ctx, "", "", func(*pgx.Batch) {})
		require.NoError(t, err)
		require.True(t, released)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.True(t, x.Fenced(), "a released execution writes no more")
	})
}

// Queued writes of several sessions commit together (groupCommit); a
// session whose write fails must fail alone.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	const n = 24
	var xs []*ledger.Execution
	for i := range n {
		s := fmt.Sprintf("s%02d", i)
		b.session(t, s, 1)
		x, err := b.claims.AcquireWaiting(ctx, s, "e-"+s, nil)
		require.NoError(t, err)
		xs = append(xs, x)
	}
	fenced := xs[n/2]
	b.expire(t, fenced.Claim().SessionID)

	// Rounds of concurrent writes until one combined transaction has
	// held the fenced session (it fails, and its sessions are sent again
	// one by one).
	rounds := 0
	for deadline := time.Now().Add(20 * time.Second); ; rounds++ {
		_, separated := ledger.GroupCommitCounts(b.claims)
		if separated > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no combined transaction held the fenced session")
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, x := range xs {
			wg.Go(func() {
				<-start
				if x == fenced && x.Fenced() {
					return
				}
				errs[i] = x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
					queueRow(batch, outbox.Row{Topic: "t", Key: x.Claim().SessionID, Payload: []byte("x")})
				})
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if xs[i] == fenced {
				if err != nil {
					require.ErrorIs(t, err, ledger.ErrFenced)
				}
				continue
			}
			require.NoError(t, err, "session %d must not fail with another's fence", i)
		}
		if fenced.Fenced() {
			// Fenced for good; a fresh zombie writer keeps the case alive.
			fenced = zombie(t, b, fenced)
			xs[n/2] = fenced
		}
	}
	combined, _ := ledger.GroupCommitCounts(b.claims)
	require.Positive(t, combined)
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE key = $1`, fenced.Claim().SessionID),
		"nothing of the fenced session was written")
	require.Equal(t, (n-1)*(rounds), b.count(t, `SELECT count(*) FROM outbox`),
		"every other session's write of every round, exactly once")
}

// zombie returns a new execution of x's session whose claim has expired:
// its writes are fenced.
func zombie(t *testing.T, b *testBundle, x *ledger.Execution) *ledger.Execution {
	t.Helper()
	s := x.Claim().SessionID
	b.exec(t, `DELETE FROM claims WHERE session_id = $1`, s)
	z, err := b.claims.AcquireWaiting(context.Background(), s, x.Claim().ExecutionID+"-z", nil)
	require.NoError(t, err)
	b.expire(t, s)
	return z
}

func (b *testBundle) phase(t *testing.T, session string) string {
	t.Helper()
	var p string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT phase FROM claims WHERE session_id = $1`, session).Scan(&p))
	return p
}

// Every write that passes the fence renews the lease, and the execution
// counts its lease from when that write was sent (the retries of a later
// write stop before it ends): queued or transactional, as an execution
// begins or as it goes. A write refused by the fence renews nothing.
func TestEveryFencedWriteRestartsTheLeaseCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 2)
	x := b.acquire(t, "s", "e1")
	old := time.Now().Add(-time.Hour)
	restarted := func(what string, write func() error) {
		t.Helper()
		ledger.SetLeaseFrom(x, old)
		before := time.Now()
		require.NoError(t, write(), what)
		require.False(t, ledger.LeaseFrom(x).Before(before), "%s: the lease counts from this write", what)
	}
	restarted("WriteQueued", func() error {
		return x.WriteQueued(ctx, "", "", func(b *pgx.Batch) {})
	})
	restarted("Write", func() error {
		return x.Write(ctx, func(pgx.Tx) error { return nil })
	})

	b.exec(t, `UPDATE claims SET fencing_token = fencing_token + 1`) // taken over
	ledger.SetLeaseFrom(x, old)
	require.ErrorIs(t, x.WriteQueued(ctx, "", "", func(b *pgx.Batch) {}), ledger.ErrFenced)
	require.True(t, old.Equal(ledger.LeaseFrom(x)), "a refused write renews nothing")
}

// queueRow queues an outbox row's insert on a queued write: a write of the
// execution's transaction that the tests can see.
func queueRow(b *pgx.Batch, r outbox.Row) {
	b.Queue(`INSERT INTO outbox (topic, key, payload) VALUES ($1, $2, $3)`, r.Topic, r.Key, r.Payload)
}
