package ledger_test

import (
	"context"
	"testing"

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
			outbox.QueueInsert(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("live")})
		}))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox`))

		b.expire(t, "s")
		err = x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
			outbox.QueueInsert(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("zombie")})
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
			outbox.QueueInsert(batch, outbox.Row{Topic: "t", Key: "s", Payload: []byte("x")})
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

func (b *testBundle) phase(t *testing.T, session string) string {
	t.Helper()
	var p string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT phase FROM claims WHERE session_id = $1`, session).Scan(&p))
	return p
}
