package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// Crash window "stale-write": a combined transaction [a, b] whose
// connection is cut while the server still runs it, blocked in a's part
// (here on a's session row, as admission holds it) before it reached b's
// fence. b's retry passes b's fence at once, finds its write not there and
// commits it; b writes on. When a's lock goes, the lost transaction goes
// on too: b's fence must refuse it, or b's first write is applied a second
// time after b's next one (its outbox row twice, its phase set back).
func TestStaleWriteAfterItsRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newStaleWriteRig(t)
	// An input waits in each: a finishing write keeps the claim.
	r.b.session(t, "a", 1)
	r.b.session(t, "b", 1)
	xa := r.b.acquire(t, "a", "e-a")
	xb := r.b.acquire(t, "b", "e-b")
	lockA := r.lock("a") // as admission holds a's row while it admits
	blocked := r.busyFlushes()

	row := func(s, p string) outbox.Row { return outbox.Row{Topic: "t", Key: s, Payload: []byte(p)} }
	landed := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		var n int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE key = 'b' AND payload = 'b1'`).Scan(&n)
		return n > 0, err
	}
	aDone, bDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := xa.FinishQueued(ctx, "", "", func(batch *pgx.Batch) { queueRow(batch, row("a", "a1")) })
		aDone <- err
	}()
	go func() {
		_, err := xb.FinishQueuedRetried(ctx, ledger.RetryOpts{Landed: landed}, ledger.PhaseSafe, "",
			func(batch *pgx.Batch) { queueRow(batch, row("b", "b1")) })
		bDone <- err
	}()
	require.Eventually(t, func() bool { return ledger.GroupCommitQueued(r.b.claims) == 2 }, 20*time.Second, 5*time.Millisecond,
		"a and b wait together for a flush")
	r.freeFlushes(blocked)
	// The combined transaction waits in a's part, for a's session row.
	var lost []int
	require.Eventually(t, func() bool { lost = r.waiters("%promptline_finish_open%"); return len(lost) == 1 },
		20*time.Second, 5*time.Millisecond, "the combined transaction waits for a's row")
	combined, _ := ledger.GroupCommitCounts(r.b.claims)
	require.EqualValues(t, 1, combined, "a and b went out together")

	r.cutWithItsCancel()
	require.Error(t, <-aDone, "a's write is in doubt, and not retried")
	require.NoError(t, <-bDone, "b's write is retried, and commits")
	require.NoError(t, xb.WriteQueued(ctx, ledger.PhaseUnknown, "", func(batch *pgx.Batch) { queueRow(batch, row("b", "b2")) }),
		"b's next write")
	require.Equal(t, lost, r.waiters("%promptline_finish_open%"), "the lost transaction still waits")

	// a's row is free: the lost transaction runs to its end.
	require.NoError(t, lockA.Commit(ctx))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, r.watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, lost[0]).Scan(&n))
		return n == 0
	}, 20*time.Second, 5*time.Millisecond, "the lost transaction's backend ends")

	var phase string
	require.NoError(t, r.b.pool.QueryRow(ctx, `SELECT phase FROM claims WHERE session_id = 'b'`).Scan(&phase))
	twice := r.b.count(t, `SELECT count(*) FROM outbox WHERE key = 'b' AND payload = 'b1'`)
	require.Equal(t, []any{1, string(ledger.PhaseUnknown)}, []any{twice, phase},
		"b's first write is applied once, and b's phase is its last write's, never set back")
	require.Zero(t, r.b.count(t, `SELECT count(*) FROM outbox WHERE key = 'a'`),
		"b's fence refused the lost transaction, which rolled back whole: a's write too, in doubt for a, as it was told")
}

// staleWriteRig is the set-up of the "stale-write" tests: claims whose
// pool goes through a proxy, every write retry held until proceed, and
// connections outside the proxy for the locks and the watch.
type staleWriteRig struct {
	t        *testing.T
	b        *testBundle
	proxy    *pgproxy.Proxy
	retrying chan struct{}
	proceed  chan struct{}
	watch    *pgx.Conn
	lockBlk  pgx.Tx
}

func newStaleWriteRig(t *testing.T) *staleWriteRig {
	t.Helper()
	pool, proxy, ppool := proxiedPools(t, nil)
	r := &staleWriteRig{t: t, proxy: proxy, retrying: make(chan struct{}, 1), proceed: make(chan struct{})}
	r.b = &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "owner-a",
		OnWriteRetryFunc: func() {
			select {
			case r.retrying <- struct{}{}:
			default:
			}
			<-r.proceed
		}})}
	for i := range ledger.GroupCommitMaxInFlight {
		r.b.session(t, fmt.Sprintf("blk%d", i), 1)
	}
	r.watch = r.connect()
	return r
}

// connect opens a connection outside the proxied pool.
func (r *staleWriteRig) connect() *pgx.Conn {
	conn, err := pgx.ConnectConfig(context.Background(), r.b.pool.Config().ConnConfig.Copy())
	require.NoError(r.t, err)
	r.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// lock holds the rows of the sessions matching like in a transaction of
// its own.
func (r *staleWriteRig) lock(like string) pgx.Tx {
	ctx := context.Background()
	tx, err := r.connect().Begin(ctx)
	require.NoError(r.t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id LIKE $1 FOR UPDATE`, like)
	require.NoError(r.t, err)
	return tx
}

// waiters are the backends waiting for a lock whose query matches like.
func (r *staleWriteRig) waiters(like string) []int {
	rows, err := r.watch.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE $1`, like)
	require.NoError(r.t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(r.t, err)
	return pids
}

// busyFlushes holds every group-commit flush busy, one at a time (each
// waits for its blk session's row), so that the writes sent next queue
// together; freeFlushes lets them go.
func (r *staleWriteRig) busyFlushes() (blocked chan error) {
	lockBlk := r.lock("blk%")
	r.t.Cleanup(func() { _ = lockBlk.Rollback(context.Background()) })
	blocked = make(chan error, ledger.GroupCommitMaxInFlight+1)
	for i := range ledger.GroupCommitMaxInFlight {
		go func() {
			_, err := r.b.claims.AcquireWaiting(context.Background(), fmt.Sprintf("blk%d", i), fmt.Sprintf("e-blk%d", i), nil)
			blocked <- err
		}()
		require.Eventually(r.t, func() bool { return len(r.waiters("%")) >= i+1 }, 20*time.Second, 10*time.Millisecond)
	}
	r.lockBlk = lockBlk
	return blocked
}

func (r *staleWriteRig) freeFlushes(blocked chan error) {
	require.NoError(r.t, r.lockBlk.Commit(context.Background()))
	for range ledger.GroupCommitMaxInFlight {
		require.NoError(r.t, <-blocked)
	}
}

// cutWithItsCancel cuts the proxied connections and refuses new ones, as
// a partition does, until pgx's cancel request (a connection of its own,
// sent when a connection breaks) was refused too: the server goes on
// with what it runs, unaware. Then the held retries proceed.
func (r *staleWriteRig) cutWithItsCancel() {
	r.proxy.Refuse(true)
	require.Positive(r.t, r.proxy.CutAll())
	<-r.retrying // a retry waits until pgx's cancel request was refused
	require.Eventually(r.t, func() bool { return r.proxy.Stats().Refused > 0 }, 20*time.Second, 5*time.Millisecond,
		"pgx's cancel request is refused")
	r.proxy.Refuse(false)
	close(r.proceed)
}

// The fence's rules on a write's position (migration 00021): each position
// is applied once, none at or below the highest applied, a gap is passed
// (a write in doubt, given up) and fences what it skipped, a write that
// does not count leaves the mark alone, and a takeover starts afresh.
func TestFenceAppliesEachPositionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	token, lease := x.Claim().Token, time.Minute.Milliseconds()
	fence := func(phase *string, seq any) error {
		_, err := b.pool.Exec(ctx, `SELECT promptline_fence('s', 'e1', $1, $2, $3, '', $4)`, token, lease, phase, seq)
		return err
	}
	mark := func() (seq int64, phase string) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT write_seq, phase FROM claims WHERE session_id = 's'`).Scan(&seq, &phase))
		return seq, phase
	}
	safe, cont := string(ledger.PhaseSafe), string(ledger.PhaseContinue)
	at, _ := mark()
	require.Positive(t, at, "the acquire's promotion was a counted write")

	require.NoError(t, fence(&safe, at+1))
	require.ErrorContains(t, fence(&cont, at+1), "PLAPP", "a position is applied once")
	require.ErrorContains(t, fence(&cont, at), "PLAPP", "an older position is refused")
	seq, phase := mark()
	require.Equal(t, []any{at + 1, safe}, []any{seq, phase}, "a refused write changes nothing")

	require.NoError(t, fence(&cont, nil), "a write that does not count")
	seq, _ = mark()
	require.Equal(t, at+1, seq)
	_, err := b.pool.Exec(ctx, `SELECT promptline_fence('s', 'e1', $1, $2)`, token, lease)
	require.NoError(t, err, "the fence of the previous release still answers, uncounted")

	require.NoError(t, fence(nil, at+4), "a gap: the positions between were in doubt")
	require.ErrorContains(t, fence(nil, at+3), "PLAPP", "a skipped write arriving late is refused")

	_, err = b.pool.Exec(ctx, `SELECT promptline_fence('s', 'e1', $1, $2, NULL, '', $3)`, token+1, lease, at+9)
	require.ErrorContains(t, err, "PLFEN", "another token is a lost claim, whatever the position")

	b.expire(t, "s")
	old, ok, err := ledger.Get(ctx, b.pool, "s")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := ledger.Takeover(ctx, tx, old, "e2", "owner-b", time.Minute)
		return err
	}))
	seq, _ = mark()
	require.Zero(t, seq, "a takeover's claim counts from the start")
}
