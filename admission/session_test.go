package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestSessionWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		return &testBundle{pool: poolWithSessions(t, "a", "b", "c")}
	}

	t.Run("LockSessionBlocksASecondTransactionUntilTheFirstEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "a"})
		require.NoError(t, err)
		require.True(t, found)

		type result struct {
			found bool
			err   error
		}
		second := make(chan result, 1)
		go func() {
			var r result
			r.err = pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				r.found, err = admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "a"})
				return err
			})
			second <- r
		}()
		require.Eventually(t, func() bool {
			return testkit.Count(t, b.pool, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the second lock waits for the first transaction")
		require.Empty(t, second, "the second lock returned while the first transaction holds the row")

		// Another session's row is not locked.
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "b"})
			require.True(t, found)
			return err
		}))

		require.NoError(t, tx.Commit(ctx))
		r := <-second
		require.NoError(t, r.err)
		require.True(t, r.found)
	})

	t.Run("LockSessionReportsAMissingSession", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "nobody"})
			require.False(t, found)
			return err
		}))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 'nobody'`), "a lock creates no session")
	})

	t.Run("MarkRedrivenMarksOnlyTheNamedSessions", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mark := func(ids ...string) {
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				return admission.MarkRedriven(ctx, tx, &admission.MarkRedrivenParams{SessionIDs: ids})
			}))
		}
		mark()
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL`))
		mark("a", "c", "nobody")
		require.Equal(t, 2, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE redriven_at IS NOT NULL AND session_id IN ('a', 'c')`))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE redriven_at IS NULL AND session_id = 'b'`))
		require.Equal(t, 3, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions`), "marking creates no session")
	})
}
