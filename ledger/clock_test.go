package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// The lease is judged by the database clock when the fence runs, not when
// its transaction began (invariants 5 and 6): a transaction may wait inside
// itself (a release waits for the session row's lock, up to lock_timeout;
// a combined group commit runs many fences under one start time), and a
// lease that ran out during that wait must fence, not renew itself.
func TestLeaseIsJudgedByTheClockNotTheTransactionStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = 2 * time.Second

	// untilExpired is a Postgres-side wait until just past the claim's
	// expiry.
	const untilExpired = `SELECT pg_sleep(greatest(0, extract(epoch FROM expires_at - clock_timestamp())) + 0.2) FROM claims WHERE session_id = 's'`

	t.Run("FenceAfterTheLeaseRanOutInsideTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		expires := b.expiresAt(t, "s")

		err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, untilExpired); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT promptline_fence('s', 'e1', $1, $2)`, x.Claim().Token, lease.Milliseconds())
			return err
		})
		require.ErrorContains(t, err, "PLFEN", "a lease that ran out inside the transaction fences")
		c, ok, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, c.ExpiresAt.Equal(expires), "the expired claim was not renewed: expires %s, was %s", c.ExpiresAt, expires)
	})

	t.Run("ReleaseWaitingForTheSessionLockPastTheLeaseIsFenced", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		expires := b.expiresAt(t, "s")

		// Another transaction (admission, say) holds the session row.
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
		_, err = holder.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE`)
		require.NoError(t, err)

		type result struct {
			released bool
			err      error
		}
		done := make(chan result, 1)
		go func() {
			released, err := x.Release(ctx, ledger.ReleaseOpts{})
			done <- result{released, err}
		}()
		// The release's transaction has begun, before the lease ran out,
		// and waits for the session row.
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'`) == 1
		}, 10*time.Second, 10*time.Millisecond)
		_, err = holder.Exec(ctx, untilExpired)
		require.NoError(t, err)
		require.NoError(t, holder.Commit(ctx))

		r := <-done
		require.ErrorIs(t, r.err, ledger.ErrFenced, "the lease ran out while the release waited")
		require.False(t, r.released)
		c, ok, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.True(t, ok, "a fenced release deletes nothing")
		require.True(t, c.ExpiresAt.Equal(expires), "the expired claim was not renewed: expires %s, was %s", c.ExpiresAt, expires)
	})

	t.Run("RenewalCountsTheLeaseFromTheClock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 10*time.Second)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		var ahead float64
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(1)`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT promptline_fence('s', 'e1', $1, $2)`, x.Claim().Token, (10 * time.Second).Milliseconds()); err != nil {
				return err
			}
			// now() is the transaction's start, a second before the fence.
			return tx.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - now()) FROM claims WHERE session_id = 's'`).Scan(&ahead)
		}))
		require.GreaterOrEqual(t, ahead, 10.9, "the renewed lease counts from the fence, not from the transaction's start")
	})

	t.Run("TakeoverSeesTheLeaseRunOutInsideTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lease)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		var nc ledger.Claim
		var ahead float64
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, untilExpired); err != nil {
				return err
			}
			cur, _, err := ledger.Get(ctx, tx, "s") // the claim as recovery's scan reads it
			if err != nil {
				return err
			}
			if nc, err = ledger.Takeover(ctx, tx, cur, "e2", "recovery", time.Minute); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM claims WHERE session_id = 's'`).Scan(&ahead)
		}), "the claim expired by the clock can be taken over in the same transaction")
		require.Equal(t, x.Claim().Token+1, nc.Token)
		require.Greater(t, ahead, 59.0, "the new lease counts from the takeover")
		require.ErrorIs(t, x.Write(ctx, nil), ledger.ErrFenced)
	})
}

// expiresAt reads the lease of session's claim as it is now.
func (b *testBundle) expiresAt(t *testing.T, session string) time.Time {
	t.Helper()
	c, ok, err := ledger.Get(context.Background(), b.pool, session)
	require.NoError(t, err)
	require.True(t, ok)
	return c.ExpiresAt
}
