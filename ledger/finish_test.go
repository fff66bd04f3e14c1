package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

func TestFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesInTheSameTransactionWhenNothingWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x, err := b.claims.Acquire(ctx, "s", "e1", nil)
		require.NoError(t, err)
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
		x, err := b.claims.Acquire(ctx, "s", "e1", nil)
		require.NoError(t, err)
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
		x, err := b.claims.Acquire(ctx, "s", "e1", nil)
		require.NoError(t, err)
		boom := errors.New("boom")
		released, err := x.Finish(ctx, func(pgx.Tx) error { return boom })
		require.ErrorIs(t, err, boom)
		require.False(t, released)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`))
		require.False(t, x.Fenced())
	})
}

func TestAcquireThenFailingLeavesNoClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 0)
	boom := errors.New("boom")
	ran := false
	_, err := b.claims.Acquire(ctx, "s", "e1", func(tx pgx.Tx, x *ledger.Execution) error {
		ran = true
		require.Equal(t, int64(1), x.Claim().Token)
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.True(t, ran)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM claims`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM sessions WHERE fencing_token = 0`), "the token bump is rolled back with the claim")

	x, err := b.claims.Acquire(ctx, "s", "e2", nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), x.Claim().Token)
}
