package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

type testBundle struct {
	pool   *pgxpool.Pool
	claims *ledger.Claims
}

func setup(t *testing.T, lease time.Duration) *testBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	return &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "owner-a"})}
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

// session creates a session row with n waiting inputs.
func (b *testBundle) session(t *testing.T, id string, waiting int) {
	t.Helper()
	b.exec(t, `INSERT INTO sessions (session_id) VALUES ($1)`, id)
	for i := range waiting {
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ($1, $2, 'x', '\x00', 'queue', true)`, id+"-in-"+string(rune('a'+i)), id)
	}
}

// acquire takes session's claim for execution as the executor does, with
// AcquireWaiting, which claims only when an input waits. A session built
// with no waiting input gets one, promoted in the execution's first write
// (behind the fence, as the executor promotes a turn), so the session is
// left claimed with the waiting inputs the test built and no more. That
// write renews the lease: x.Claim().ExpiresAt is the lease as acquired, and
// ledger.Get reads it as it is now.
func (b *testBundle) acquire(t *testing.T, session, execution string) *ledger.Execution {
	t.Helper()
	ctx := context.Background()
	input := ""
	if b.count(t, `SELECT count(*) FROM waiting_inputs WHERE session_id = $1`, session) == 0 {
		input = session + "-turn-" + execution
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ($1, $2, 'x', '\x00', 'queue', true)`, input, session)
	}
	x, err := b.claims.AcquireWaiting(ctx, session, execution, nil)
	require.NoError(t, err)
	if input != "" {
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now()
				WHERE message_id = $1 AND promotion_seq IS NULL`, input)
			return err
		}))
	}
	return x
}

// expire moves the claim's lease into the past: the database clock, not a
// sleep, decides expiry.
func (b *testBundle) expire(t *testing.T, session string) {
	b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = $1`, session)
}

func TestClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AcquireGivesGrowingTokensAndNeverReplaces", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		// The input keeps waiting throughout: every acquisition below
		// would claim, were the session free.
		b.session(t, "s", 1)
		x1, err := b.claims.AcquireWaiting(ctx, "s", "e1", nil)
		require.NoError(t, err)
		require.Equal(t, int64(1), x1.Claim().Token)
		require.Equal(t, ledger.PhaseReady, x1.Claim().Phase)
		require.WithinDuration(t, time.Now().Add(30*time.Second), x1.Claim().ExpiresAt, 10*time.Second)
		_, err = b.claims.AcquireWaiting(ctx, "s", "e2", nil)
		require.ErrorIs(t, err, ledger.ErrClaimHeld, "a live claim is never replaced")

		released, err := x1.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: outbox.Row{Topic: "wakes", Key: "s", Payload: []byte("{}")}})
		require.NoError(t, err)
		require.True(t, released)
		x2, err := b.claims.AcquireWaiting(ctx, "s", "e2", nil)
		require.NoError(t, err)
		require.Equal(t, int64(2), x2.Claim().Token, "tokens only grow")

		b.expire(t, "s")
		_, err = b.claims.AcquireWaiting(ctx, "s", "e3", nil)
		require.ErrorIs(t, err, ledger.ErrClaimHeld, "an expired claim is never replaced by acquisition")
		c, ok, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "e2", c.ExecutionID)
	})

	t.Run("WriteIsFencedByTokenAndLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE sessions SET last_admitted_at = now() WHERE session_id = 's'`)
			return err
		}))

		b.expire(t, "s")
		wrote := false
		err := x.Write(ctx, func(pgx.Tx) error { wrote = true; return nil })
		require.ErrorIs(t, err, ledger.ErrFenced, "an expired lease fences, even before any takeover")
		require.False(t, wrote, "the write function never runs behind a failed fence")
		require.True(t, x.Fenced())
		require.Error(t, x.Context().Err(), "fencing cancels the execution's context")
		require.ErrorIs(t, x.Renew(ctx), ledger.ErrFenced, "an expired claim never renews itself")
		require.True(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND expires_at <= now()`) == 1,
			"the failed renewal did not extend the lease")
	})

	t.Run("TakeoverFencesTheOldExecution", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		old, ok, err := ledger.Get(ctx, b.pool, "s") // the claim as a scan reads it, live
		require.NoError(t, err)
		require.True(t, ok)

		err = pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := ledger.Takeover(ctx, tx, old, "e2", "recovery", time.Minute)
			return err
		})
		require.ErrorIs(t, err, ledger.ErrNotExpired, "a live claim cannot be taken over")

		cur, nc := b.takeOverExpired(t, "s", "e2")
		require.Equal(t, old.Token+1, nc.Token)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE session_id = 's' AND fencing_token = $1`, nc.Token))

		// The same (now stale) view of the claim cannot win twice.
		err = pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := ledger.Takeover(ctx, tx, cur, "e3", "recovery-2", time.Minute)
			return err
		})
		require.ErrorIs(t, err, ledger.ErrNotExpired)

		// The old execution writes nothing, and a fenced write is counted once.
		require.ErrorIs(t, x.Write(ctx, func(pgx.Tx) error { return nil }), ledger.ErrFenced)
	})

	// A session row whose token is behind its claim's (a restore of one
	// table older than the other, a hand edit) gives no takeover a token
	// the claim's holder had: the token is handed to tools and providers
	// as the writer's, and must grow.
	t.Run("TakeoverTokenPassesTheClaimsWhateverTheSessionSays", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.acquire(t, "s", "e1")
		b.exec(t, `UPDATE claims SET fencing_token = 7 WHERE session_id = 's'`)
		b.exec(t, `UPDATE sessions SET fencing_token = 3 WHERE session_id = 's'`)
		_, nc := b.takeOverExpired(t, "s", "e2")
		require.Equal(t, int64(8), nc.Token)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE session_id = 's' AND fencing_token = 8`))
	})

	t.Run("ReleaseWithWaitingInputWritesWakeInSameTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		x := b.acquire(t, "s", "e1")

		released, err := x.Release(ctx, ledger.ReleaseOpts{})
		require.NoError(t, err)
		require.False(t, released, "not stopping and input waits: keep the claim and run it")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims`))

		wake := outbox.Row{Topic: "wakes", Key: "s", Payload: []byte(`{"session_id":"s"}`)}
		released, err = x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: wake})
		require.NoError(t, err)
		require.True(t, released)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 's'`),
			"invariant 7: the claim goes only with a wake for the waiting input")
		require.ErrorIs(t, x.Write(ctx, nil), ledger.ErrFenced, "a released execution writes nothing")
	})

	t.Run("ReleaseWithoutWaitingInputWritesNoWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('parked', 's', 'x', '\x00', 'queue', false)`) // resume=false: not waiting
		x := b.acquire(t, "s", "e1")
		released, err := x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: outbox.Row{Topic: "wakes", Key: "s", Payload: []byte("{}")}})
		require.NoError(t, err)
		require.True(t, released)
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))
	})

	// Stopped, the renewals end: the lease then runs out and the execution
	// is fenced at its next write. Renewing on regardless, the claim would
	// stay live and the wait below would time out.
	t.Run("StoppedRenewalsLetTheLeaseRunOut", func(t *testing.T) {
		t.Parallel()
		var renewals atomic.Int32
		b := setup(t, 300*time.Millisecond)
		b.claims = ledger.NewClaims(b.pool, &ledger.ClaimsConfig{
			Lease: 300 * time.Millisecond, OwnerID: "a",
			OnRenewedFunc: func() { renewals.Add(1) },
		})
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		stop := x.KeepAlive(ctx)
		t.Cleanup(stop) // a failure below leaves no renewals running
		require.Eventually(t, func() bool { return renewals.Load() >= 2 }, 10*time.Second, 5*time.Millisecond, "renewing")
		stop()
		stop() // a second stop is a no-op
		after := renewals.Load()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND expires_at < clock_timestamp()`) == 1
		}, 10*time.Second, 20*time.Millisecond, "the lease runs out once the renewals stop")
		require.Equal(t, after, renewals.Load(), "no renewal after stop returned")
		require.ErrorIs(t, x.Write(ctx, nil), ledger.ErrFenced)
	})

	// A renewal is a transaction of its own, on a connection of its own:
	// it must not wait behind other sessions' writes that wait on a lock
	// (group commit's flushes, four at most, can all be such writes).
	// Queued behind them, a healthy execution's lease ran out and it was
	// fenced mid-turn (docs/benchmarks.md, "renewals group-committed:
	// measured and not kept").
	t.Run("RenewalDoesNotWaitBehindOtherSessionsLocks", func(t *testing.T) {
		t.Parallel()
		_, url := testkit.Pool(t)
		pool, err := pgxpool.New(ctx, url+"&pool_max_conns=20") // room for every waiter, the holder and the renewal
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{OwnerID: "owner-a"})}
		b.session(t, "a", 0)
		x := b.acquire(t, "a", "ea")
		var others []string
		for i := range ledger.GroupCommitMaxInFlight {
			s := fmt.Sprintf("locked%d", i)
			b.session(t, s, 1)
			others = append(others, s)
		}
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = ANY($1) FOR UPDATE`, others)
		require.NoError(t, err)
		// One at a time, so that each finds the flushes before it stuck
		// and starts its own: every flush group commit runs, waiting.
		var waiting sync.WaitGroup
		for i, s := range others {
			waiting.Go(func() { _, _ = b.claims.AcquireWaiting(ctx, s, "e-"+s, nil) })
			require.Eventually(t, func() bool {
				return b.lockWaiters(t) == i+1
			}, 10*time.Second, 10*time.Millisecond, "the other sessions' writes wait on the lock, one flush each")
		}

		renewed := make(chan error, 1)
		go func() { renewed <- x.Renew(ctx) }()
		select {
		case err := <-renewed:
			require.NoError(t, err, "renewed while the other sessions still wait")
		case <-time.After(5 * time.Second):
			require.FailNow(t, "the renewal waits behind other sessions' locks")
		}
		require.NoError(t, holder.Rollback(ctx))
		waiting.Wait()
	})

	// KeepAlive's stop, once the turn's context ended, does not wait for
	// the database: a renewal under way, blocked on a lock, ends with
	// its context (a hard stop must not wait for a lock timeout).
	t.Run("StopDoesNotWaitForABlockedRenewal", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 600*time.Millisecond)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `SELECT 1 FROM claims WHERE session_id = 's' FOR UPDATE`)
		require.NoError(t, err)

		kctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := x.KeepAlive(kctx)
		require.Eventually(t, func() bool {
			return b.lockWaiters(t) == 1
		}, 10*time.Second, 10*time.Millisecond, "a renewal is under way, blocked on the claim's lock")
		cancel()
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			require.FailNow(t, "stop waits for the blocked renewal")
		}
		require.Eventually(t, func() bool {
			return b.lockWaiters(t) == 0
		}, 10*time.Second, 10*time.Millisecond, "the renewal's statement ended with its context, the lock still held")
	})

	t.Run("RenewalKeepsALiveClaimAcrossSeveralLeases", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 600*time.Millisecond)
		b.session(t, "s", 0)
		renewed := make(chan struct{}, 100)
		b.claims = ledger.NewClaims(b.pool, &ledger.ClaimsConfig{
			Lease: 600 * time.Millisecond, OwnerID: "a",
			OnRenewedFunc: func() { renewed <- struct{}{} },
		})
		x := b.acquire(t, "s", "e1")
		kctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := x.KeepAlive(kctx)
		deadline := time.NewTimer(20 * time.Second)
		defer deadline.Stop()
		for i := range 8 { // 8 renewals at lease/3: about 1.6 s, well over two leases
			select {
			case <-renewed:
			case <-deadline.C:
				require.FailNow(t, "renewals stopped", "%d of 8 renewals; fenced: %v", i, x.Fenced())
			}
		}
		stop()
		require.False(t, x.Fenced())
		require.NoError(t, x.Write(ctx, nil), "still the writer after outliving several leases")
	})
}

// lockWaiters counts the backends of the test's database waiting on a
// lock.
func (b *testBundle) lockWaiters(t *testing.T) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`)
}

// takeOverExpired expires session's claim and takes it over, as recovery
// does, for execution; it returns the claim as read before and the new
// one.
func (b *testBundle) takeOverExpired(t *testing.T, session, execution string) (cur, nc ledger.Claim) {
	t.Helper()
	ctx := context.Background()
	b.expire(t, session)
	cur, ok, err := ledger.Get(ctx, b.pool, session)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
		nc, err = ledger.Takeover(ctx, tx, cur, execution, "recovery", time.Minute)
		return err
	}))
	return cur, nc
}
