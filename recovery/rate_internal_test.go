package recovery

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// A take that finds less than a token says how long until the next one:
// the fraction missing over the rate. A quarter of a token at one token a
// second leaves three quarters of a second to wait.
func TestTakeTokensSaysTheWaitForTheNextToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	r := New(pool, &Config{Rate: 1})
	_, err := pool.Exec(ctx, `UPDATE recovery_rate SET tokens = 0.25, updated_at = clock_timestamp()`)
	require.NoError(t, err)
	var got taken
	require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		got, err = r.takeTokens(ctx, tx, 1)
		return err
	}))
	require.Zero(t, got.got)
	// The refill between the UPDATE and the take is a few milliseconds'.
	require.InDelta(t, 0.75, got.after.Seconds(), 0.1, "after %s", got.after)
	require.Less(t, got.after, 750*time.Millisecond)
}

// A lost-wakes scan that finds nothing (every pass of an idle fleet) takes
// no token and leaves the bucket's row alone: one row every recoverer
// shares, written by each pass, would be contention and WAL for nothing.
func TestRedriveOfNothingLeavesTheBucketAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	r := New(pool, &Config{Rate: 1})
	bucket := func() (at time.Time) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT updated_at FROM recovery_rate`).Scan(&at))
		return at
	}
	before := bucket()
	n, left, _, err := r.redriveFor(ctx, "", 100, true)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Zero(t, left)
	require.Equal(t, before, bucket())
}

// A paced pass puts the bucket's row back when it is missing (without it
// every paced decision would wait for good); an unpaced pass does not
// touch the table.
func TestPacedPassRestoresTheBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	rows := func() int { return testkit.Count(t, pool, `SELECT count(*) FROM recovery_rate`) }
	_, err := pool.Exec(ctx, `DELETE FROM recovery_rate`)
	require.NoError(t, err)
	_, err = New(pool, &Config{OwnerID: "r"}).RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, rows(), "unpaced")
	_, err = New(pool, &Config{OwnerID: "r", Rate: 100}).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rows(), "paced")
}
