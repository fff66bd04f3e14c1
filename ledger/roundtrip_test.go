package ledger_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// A write whose connection goes silent after the server committed it (a
// silent partition, a failover with no reset: nothing comes back, and a
// middlebox or the far kernel still acknowledges, so TCP never gives up)
// is given up after ClaimsConfig.RoundTripTimeout, never sooner than the
// lease: its error is transient and says nothing of the commit, which is
// there once. Called without a deadline, as the executor's writes and
// renewals are.
func TestSilentConnectionIsGivenUp(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	setup := func(t *testing.T) (*testBundle, *pgproxy.Proxy, *ledger.Execution) {
		t.Helper()
		ctx := context.Background()
		pool, proxy, ppool := proxiedPools(t, nil)
		// Before the pool's Close, which waits for a write still on a
		// silent connection: cutting them ends it.
		t.Cleanup(proxy.Close)
		// Asked for less than the lease: given up at the lease all the same.
		b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{
			Lease: lease, RoundTripTimeout: 100 * time.Millisecond, OwnerID: "owner-a"})}
		b.session(t, "s1", 1)
		x, err := b.claims.AcquireWaiting(ctx, "s1", "e-s1", nil)
		require.NoError(t, err)
		return b, proxy, x
	}
	// given runs write without a deadline and returns how long it waited
	// and its error; the test's own bound fails a wait that never ends.
	given := func(t *testing.T, write func(ctx context.Context) error) (time.Duration, error) {
		t.Helper()
		began := time.Now()
		done := make(chan error, 1)
		go func() { done <- write(context.Background()) }()
		select {
		case err := <-done:
			return time.Since(began), err
		case <-time.After(10 * lease):
			t.Fatalf("the write still waits on its silent connection after %s", 10*lease)
			return 0, nil
		}
	}

	t.Run("GroupCommit", func(t *testing.T) {
		t.Parallel()
		b, proxy, x := setup(t)
		proxy.SilenceAfterCommit(func(label string) bool { return strings.Contains(label, "INSERT INTO outbox") })
		waited, err := given(t, func(ctx context.Context) error {
			return x.WriteQueued(ctx, "", "", func(batch *pgx.Batch) {
				queueRow(batch, outbox.Row{Topic: "t", Key: "s1", Payload: []byte("silent")})
			})
		})
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "a connection given up is transient: %v", err)
		require.False(t, ledger.RolledBack(err), "and in doubt: %v", err)
		require.GreaterOrEqual(t, waited, lease, "never given up while the lease lives")
		require.Equal(t, 1, proxy.Stats().Silenced)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE payload = 'silent'`), "the commit landed, once")
	})

	// A transaction's statement, run on its closure's context (without a
	// deadline, as the executor's closures run theirs), on a connection
	// gone silent: given up with the write all the same. It waited for
	// good, holding the claim's row and the execution's write lock, while
	// the keep-alive renewed the lease on other connections and recovery
	// could never take the session over.
	t.Run("StatementInATransaction", func(t *testing.T) {
		t.Parallel()
		_, proxy, x := setup(t)
		proxy.SilenceAt(func(stmts []string) bool {
			for _, s := range stmts {
				if strings.Contains(s, "silent-statement") {
					return true
				}
			}
			return false
		})
		waited, err := given(t, func(ctx context.Context) error {
			return x.Write(ctx, func(tx pgx.Tx) error {
				_, err := tx.Exec(context.Background(), `INSERT INTO outbox (topic, key, payload) VALUES ('t', 's1', 'silent-statement')`)
				return err
			})
		})
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "a connection given up is transient: %v", err)
		require.GreaterOrEqual(t, waited, lease, "never given up while the lease lives")
		require.Equal(t, 1, proxy.Stats().Silenced)
	})

	t.Run("Renewal", func(t *testing.T) {
		t.Parallel()
		_, proxy, x := setup(t)
		proxy.SilenceAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_fence") })
		waited, err := given(t, x.Renew)
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "a connection given up is transient: %v", err)
		require.GreaterOrEqual(t, waited, lease, "never given up while the lease lives")
		require.Equal(t, 1, proxy.Stats().Silenced)
	})
}
