package outbox

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// Release lifts the quarantine of the one row named, returns the reason it
// had, and finds nothing for a row that is not quarantined or an ID that is
// not a row's as the operator typed it.
func TestRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	var ids []int64
	for _, key := range []string{"a", "b", "c"} {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, '\x00') RETURNING id`, key).Scan(&id))
		ids = append(ids, id)
	}
	_, err := pool.Exec(ctx, quarantineSQL, ids[0], "too large")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, quarantineSQL, ids[1], "refused")
	require.NoError(t, err)
	release := func(id string) (string, bool) {
		t.Helper()
		var reason string
		var found bool
		require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
			var err error
			reason, found, err = Release(ctx, tx, &ReleaseParams{ID: id})
			return err
		}))
		return reason, found
	}
	first := strconv.FormatInt(ids[0], 10)
	for _, id := range []string{strconv.FormatInt(ids[2], 10), "0" + first, "+" + first, first + " ", "x", "99999999999999999999", ""} {
		_, found := release(id)
		require.False(t, found, "%q", id)
	}
	reason, found := release(first)
	require.True(t, found)
	require.Equal(t, "too large", reason)
	require.Equal(t, 1, testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL`), "the other row stays quarantined")
	require.Equal(t, 1, testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND quarantine_reason IS NULL AND quarantined_at IS NULL`, ids[0]))
	_, found = release(first)
	require.False(t, found, "released once")
}

// CountQuarantined counts the quarantined rows only, on the pool or in a
// transaction; an error is the driver's.
func TestCountQuarantined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	count := func() int {
		t.Helper()
		n, err := CountQuarantined(ctx, pool)
		require.NoError(t, err)
		return n
	}
	require.Zero(t, count())
	var ids []int64
	for _, key := range []string{"a", "b", "c"} {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('t', $1, '\x00') RETURNING id`, key).Scan(&id))
		ids = append(ids, id)
	}
	require.Zero(t, count(), "unpublished rows are not quarantined")
	for _, id := range ids[:2] {
		_, err := pool.Exec(ctx, quarantineSQL, id, "too large")
		require.NoError(t, err)
	}
	require.Equal(t, 2, count())

	var n int
	require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		n, err = CountQuarantined(ctx, tx)
		return err
	}))
	require.Equal(t, 2, n)
	err := pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		// An aborted transaction fails every later statement.
		_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
		_, err := CountQuarantined(ctx, tx)
		return err
	})
	require.ErrorContains(t, err, "current transaction is aborted")
}
