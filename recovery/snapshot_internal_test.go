package recovery

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// A snapshot returns its function's error, and reads in a read-only
// transaction that cannot write.
func TestSnapshotReturnsItsError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	r := New(pool, &Config{OwnerID: "r"})
	boom := errors.New("boom")
	require.ErrorIs(t, r.snapshot(ctx, func(pgx.Tx) error { return boom }), boom)
	err := r.snapshot(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('s')`)
		return err
	})
	require.ErrorContains(t, err, "read-only transaction")
	require.NoError(t, r.snapshot(ctx, func(tx pgx.Tx) error {
		var n int
		return tx.QueryRow(ctx, `SELECT count(*) FROM sessions`).Scan(&n)
	}))
}
