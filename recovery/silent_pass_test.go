package recovery_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/recovery"
)

// A pass whose connection goes silent while it scans for expired claims
// (a silent partition, a failover with no reset: nothing comes back, and
// something still acknowledges, so TCP never gives up) is given up after
// Config.RoundTripTimeout, and the next pass decides the claim on another
// connection. The loop's context has no deadline.
func TestRecoverySilentPassIsGivenUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	sessions := b.expiredReady(t, "silent", 1)
	proxy, proxied := pgproxy.StartFor(t, b.url)
	ppool, err := pgxpool.New(ctx, proxied)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	rec := recovery.New(ppool, &recovery.Config{Interval: 100 * time.Millisecond, Batch: 100, OwnerID: "recovery-test",
		RedriveAfter: time.Hour, RoundTripTimeout: time.Second})
	proxy.SilenceAt(func(stmts []string) bool {
		for _, s := range stmts {
			if strings.Contains(s, "FROM claims") && strings.Contains(s, "expires_at <= now()") {
				return true
			}
		}
		return false
	})
	require.NoError(t, rec.Start(ctx))
	t.Cleanup(rec.Stop)
	// Runs first: the old loop's pass still waits on its silent
	// connection, and Stop would wait for it.
	t.Cleanup(proxy.Close)
	require.Eventually(t, func() bool { return proxy.Stats().Silenced == 1 }, 15*time.Second, 10*time.Millisecond,
		"the scan is sent and its connection silenced")
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, sessions[0]) == 1
	}, 15*time.Second, 10*time.Millisecond, "recovery gave the silent pass up and decided the claim")
}
