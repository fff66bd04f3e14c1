package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// Crash window "stale-write", the other way round: the combined
// transaction [a, z] whose connection is cut has already passed a's fence
// and written a's answer (a Call, promptline_turn_answer, at its
// position), and waits in z's part, for z's session row. a's retry waits
// behind it for a's session row; once z's row is free the lost
// transaction commits, and the retry must find a's write applied (PLAPP)
// and take it as landed: the answer once, the claim kept for the input
// that waits, and the execution live, its next write applied (a retry
// that took PLAPP for a lost claim, or a position left behind, would
// wedge the session).
func TestStaleWriteBeforeItsRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := testkit.Pool(t)
	proxy, proxied := pgproxy.StartFor(t, dbURL)
	ppool, err := pgxpool.New(ctx, proxied)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	retrying, proceed := make(chan struct{}, 1), make(chan struct{})
	b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "owner-a",
		OnWriteRetryFunc: func() {
			select {
			case retrying <- struct{}{}:
			default:
			}
			<-proceed
		}})}
	for i := range ledger.GroupCommitMaxInFlight {
		b.session(t, fmt.Sprintf("blk%d", i), 1)
	}
	b.session(t, "a", 1) // an input waits: the answer keeps the claim
	b.session(t, "z", 1)
	xa := b.acquire(t, "a", "e-a")
	xz := b.acquire(t, "z", "e-z")

	connect := func() *pgx.Conn {
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	lockBlk, err := connect().Begin(ctx)
	require.NoError(t, err)
	_, err = lockBlk.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id LIKE 'blk%' FOR UPDATE`)
	require.NoError(t, err)
	lockZ, err := connect().Begin(ctx)
	require.NoError(t, err)
	_, err = lockZ.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'z' FOR UPDATE`)
	require.NoError(t, err)
	watch := connect()
	waiters := func(like string) []int {
		rows, err := watch.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE $1`, like)
		require.NoError(t, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
		return pids
	}

	blocked := make(chan error, ledger.GroupCommitMaxInFlight)
	for i := range ledger.GroupCommitMaxInFlight {
		go func() {
			_, err := b.claims.AcquireWaiting(ctx, fmt.Sprintf("blk%d", i), fmt.Sprintf("e-blk%d", i), nil)
			blocked <- err
		}()
		require.Eventually(t, func() bool { return len(waiters("%")) >= i+1 }, 20*time.Second, 10*time.Millisecond)
	}
	type result struct {
		released bool
		err      error
	}
	aDone, zDone := make(chan result, 1), make(chan error, 1)
	go func() {
		// No landed check: the position alone must keep the answer from
		// being written twice (a landed check would find it and hide a
		// fence that let the retry through).
		released, err := xa.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, "", answerCall("none", "none"))
		aDone <- result{released, err}
	}()
	go func() {
		_, err := xz.FinishQueued(ctx, "", "", func(batch *pgx.Batch) {
			queueRow(batch, outbox.Row{Topic: "t", Key: "z", Payload: []byte("z1")})
		})
		zDone <- err
	}()
	require.Eventually(t, func() bool { return ledger.GroupCommitQueued(b.claims) == 2 }, 20*time.Second, 5*time.Millisecond,
		"a and z wait together for a flush")
	require.NoError(t, lockBlk.Commit(ctx))
	for range ledger.GroupCommitMaxInFlight {
		require.NoError(t, <-blocked)
	}
	// Past a's part (its answer written, its position applied), waiting
	// for z's row.
	var lost []int
	require.Eventually(t, func() bool { lost = waiters("%promptline_finish_open%"); return len(lost) == 1 },
		20*time.Second, 5*time.Millisecond, "the combined transaction waits for z's row")

	proxy.Refuse(true)
	require.Positive(t, proxy.CutAll())
	<-retrying
	require.Eventually(t, func() bool { return proxy.Stats().Refused > 0 }, 20*time.Second, 5*time.Millisecond,
		"pgx's cancel request is refused")
	proxy.Refuse(false)
	close(proceed)
	require.Error(t, <-zDone, "z's write is in doubt, and not retried")
	// a's retry waits for a's session row, which the lost transaction holds.
	require.Eventually(t, func() bool { return len(waiters("%")) == 2 }, 20*time.Second, 5*time.Millisecond,
		"a's retry waits behind the lost transaction")
	select {
	case r := <-aDone:
		t.Fatalf("a's retry ended while the lost transaction held a's row: %+v", r)
	default:
	}
	require.NoError(t, lockZ.Commit(ctx))

	r := <-aDone
	require.NoError(t, r.err, "the retry found its write applied: landed")
	require.False(t, r.released, "an input waits: the claim is kept")
	require.False(t, xa.Fenced(), "the execution lives on")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE key = 'k' AND payload = 'answer'`), "the answer once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE key = 'z' AND payload = 'z1'`),
		"the lost transaction committed whole, z's part with it")
	require.NoError(t, xa.WriteQueued(ctx, ledger.PhaseUnknown, "", func(batch *pgx.Batch) {
		queueRow(batch, outbox.Row{Topic: "t", Key: "a", Payload: []byte("a2")})
	}), "a's next write passes its fence")
	var phase string
	require.NoError(t, pool.QueryRow(ctx, `SELECT phase FROM claims WHERE session_id = 'a'`).Scan(&phase))
	require.Equal(t, string(ledger.PhaseUnknown), phase)
}
