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
		_, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "a"})
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
				_, r.found, err = admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "a"})
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
			_, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "b"})
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
			_, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "nobody"})
			require.False(t, found)
			return err
		}))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM sessions WHERE session_id = 'nobody'`), "a lock creates no session")
	})

	// The token as locked, raised by a takeover and never lowered; the
	// queued lock is the same lock.
	t.Run("FencingTokenIsReadLockedAndOnlyRaised", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		token := func(session string) int64 {
			t.Helper()
			var tok int64
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				tok, _, err = admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: session})
				return err
			}))
			return tok
		}
		bump := func(session string, to int64) {
			t.Helper()
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				return admission.BumpFencingToken(ctx, tx, &admission.BumpFencingTokenParams{SessionID: session, Token: to})
			}))
		}
		require.Zero(t, token("a"))
		bump("a", 7)
		require.Equal(t, int64(7), token("a"))
		bump("a", 3)
		require.Equal(t, int64(7), token("a"), "never lowered")
		require.Zero(t, token("b"), "another session's token is left alone")

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		_, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: "a"})
		require.NoError(t, err)
		require.True(t, found)
		other, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = other.Rollback(context.WithoutCancel(ctx)) }()
		_, err = other.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`)
		require.NoError(t, err)
		_, _, err = admission.LockSession(ctx, other, &admission.LockSessionParams{SessionID: "a"})
		require.Error(t, err, "the lock holds the row until its transaction ends")
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
