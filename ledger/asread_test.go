package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// peekWaiting reads session s as the executor does before AcquireAsRead:
// its claim state and token, and the waiting inputs in admission order.
func peekWaiting(claims *ledger.Claims, s string) (ledger.SessionRead, []string, error) {
	var waiting []string
	r, err := claims.Peek(context.Background(), s, func(batch *pgx.Batch) {
		batch.Queue(`SELECT array_agg(message_id ORDER BY admission_seq) FROM waiting_inputs WHERE session_id = $1`, s).
			QueryRow(func(row pgx.Row) error { return row.Scan(&waiting) })
	})
	return r, waiting, err
}

func (b *testBundle) peek(t *testing.T, s string) (ledger.SessionRead, []string) {
	t.Helper()
	r, waiting, err := peekWaiting(b.claims, s)
	require.NoError(t, err)
	return r, waiting
}

// acquireAsRead claims s for execution e with one outbox row as its first
// write.
func (b *testBundle) acquireAsRead(t *testing.T, s, e string, r ledger.SessionRead, waiting []string) (*ledger.Execution, error) {
	t.Helper()
	return b.claims.AcquireAsRead(context.Background(), s, e, r, waiting, ledger.PhaseUnknown, e+"-answer",
		func(batch *pgx.Batch, x *ledger.Execution) {
			queueRow(batch, outbox.Row{Topic: "t", Key: s, Payload: []byte(x.Claim().ExecutionID)})
		})
}

// AcquireAsRead commits the claim with the execution's first write, and
// only while the session is as read: else nothing at all is written.
func TestAcquireAsRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TakesTheClaimWithItsFirstWrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 2)
		r, waiting := b.peek(t, "s")
		require.Equal(t, ledger.SessionRead{Exists: true}, r)
		require.Equal(t, []string{"s-in-a", "s-in-b"}, waiting)

		x, err := b.claims.AcquireAsRead(ctx, "s", "e1", r, waiting, ledger.PhaseUnknown, "answer-1",
			func(batch *pgx.Batch, x *ledger.Execution) {
				require.Equal(t, int64(1), x.Claim().Token, "the token is known before the claim commits")
				x.QueueBeginAttempt(batch, ledger.AttemptParams{ID: "e1/step-1", AssistantMessageID: "answer-1", Step: 1,
					Provider: "p", IdempotencyKey: "k", RequestHash: []byte{1}})
			})
		require.NoError(t, err)
		cl := x.Claim()
		require.Equal(t, int64(1), cl.Token)
		require.WithinDuration(t, time.Now(), cl.ExpiresAt, time.Minute, "the lease comes from the database")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND execution_id = 'e1'
			AND owner_id = 'owner-a' AND fencing_token = 1 AND phase = 'unknown' AND assistant_message_id = 'answer-1'`))
		require.Equal(t, 1, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "the session remembers the token")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'e1/step-1' AND fencing_token = 1 AND state = 'started'`),
			"the intent committed with the claim")

		// The execution writes on behind the fence, like any other.
		released, err := x.FinishQueued(ctx, ledger.PhaseSafe, "", func(*pgx.Batch) {})
		require.NoError(t, err)
		require.False(t, released, "inputs still wait")
		require.Equal(t, "safe", b.phase(t, "s"))

		_, err = b.claims.AcquireWaiting(ctx, "s", "e2", nil)
		require.ErrorIs(t, err, ledger.ErrClaimHeld, "the claim is an ordinary one")
	})

	// Each case changes the session between the read and the claim in one
	// way the read cannot see; the claim must be refused and the queued
	// write rolled back with it.
	for name, change := range map[string]func(t *testing.T, b *testBundle){
		"InputAdmitted": func(t *testing.T, b *testBundle) {
			b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
				VALUES ('steer', 's', 'x', '\x00', 'steer', true)`)
		},
		"InputQuarantined": func(t *testing.T, b *testBundle) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = 's-in-b'`)
		},
		"ClaimedAndReleasedSince": func(t *testing.T, b *testBundle) {
			x, err := b.claims.AcquireWaiting(context.Background(), "s", "other", nil)
			require.NoError(t, err)
			released, err := x.Release(context.Background(), ledger.ReleaseOpts{Stopping: true, Wake: outbox.Row{Topic: "w", Key: "s", Payload: []byte("w")}})
			require.NoError(t, err)
			require.True(t, released)
			b.exec(t, `DELETE FROM outbox`)
		},
		"ClaimedSince": func(t *testing.T, b *testBundle) {
			_, err := b.claims.AcquireWaiting(context.Background(), "s", "other", nil)
			require.NoError(t, err)
		},
	} {
		t.Run("RefusedWhen"+name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			b.session(t, "s", 2)
			r, waiting := b.peek(t, "s")
			change(t, b)
			token := b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`)

			_, err := b.acquireAsRead(t, "s", "e1", r, waiting)
			require.ErrorIs(t, err, ledger.ErrStale)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`), "no claim")
			require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`), "the first write rolled back")
			require.Equal(t, token, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "no token spent")
		})
	}

	t.Run("RefusedWhenClaimedAtTheRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		_, err := b.claims.AcquireWaiting(ctx, "s", "other", nil)
		require.NoError(t, err)
		r, waiting := b.peek(t, "s")
		require.Equal(t, ledger.SessionRead{Exists: true, Claimed: true, Token: 1}, r)
		_, err = b.acquireAsRead(t, "s", "e1", r, waiting)
		require.ErrorIs(t, err, ledger.ErrStale)
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))

		r, _ = b.peek(t, "missing")
		require.False(t, r.Exists)
	})

	// An admission that holds the session row while the claim waits for it
	// commits a new input: the claim, granted the lock after that commit,
	// must see the input (a check on the snapshot taken before the lock
	// would not) and refuse.
	t.Run("SeesAnInputCommittedWhileItWaitedForTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		r, waiting := b.peek(t, "s")

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('late', 's', 'x', '\x00', 'steer', true)`)
		require.NoError(t, err)

		errc := make(chan error, 1)
		go func() {
			_, err := b.claims.AcquireAsRead(ctx, "s", "e1", r, waiting, ledger.PhaseUnknown, "", func(*pgx.Batch, *ledger.Execution) {})
			errc <- err
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%promptline_claim_as_read%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the claim waits for the session row")
		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, <-errc, ledger.ErrStale)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	})
}
