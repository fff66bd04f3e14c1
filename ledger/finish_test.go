package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesInTheSameTransactionWhenNothingWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		released, err := x.Finish(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE sessions SET last_admitted_at = now() WHERE session_id = 's'`)
			return err
		})
		require.NoError(t, err)
		require.True(t, released)
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE last_admitted_at IS NOT NULL`))
		require.True(t, x.Fenced(), "a released execution writes no more")
		require.Error(t, x.Context().Err())
	})

	t.Run("KeepsTheClaimWhileAnInputWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		x := b.acquire(t, "s", "e1")
		released, err := x.Finish(ctx, func(pgx.Tx) error { return nil })
		require.NoError(t, err)
		require.False(t, released)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`))
		require.False(t, x.Fenced())
		require.NoError(t, x.Context().Err())
	})

	t.Run("AFailedWriteReleasesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		boom := errors.New("boom")
		released, err := x.Finish(ctx, func(pgx.Tx) error { return boom })
		require.ErrorIs(t, err, boom)
		require.False(t, released)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`))
		require.False(t, x.Fenced())
	})
}

// A statement queued after the claim that fails rolls the claim back with
// it, token bump and all: the batch is one implicit transaction.
func TestAcquireWaitingThenFailingLeavesNoClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 1)
	seen := -1
	_, err := b.claims.AcquireWaiting(ctx, "s", "e1", func(batch *pgx.Batch) {
		batch.Queue(`SELECT fencing_token FROM claims WHERE session_id = 's' AND execution_id = 'e1'`).
			QueryRow(func(row pgx.Row) error { return row.Scan(&seen) })
		batch.Queue(`SELECT 1 / 0`)
	})
	require.ErrorContains(t, err, "division by zero")
	require.Equal(t, 1, seen, "the statements after the claim ran in its transaction, seeing token 1")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM claims`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE fencing_token = 0`), "the token bump is rolled back with the claim")

	x := b.acquire(t, "s", "e2")
	require.Equal(t, int64(1), x.Claim().Token)
}
