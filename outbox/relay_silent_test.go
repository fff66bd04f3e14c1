package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
)

// A pass whose connection goes silent while it reads the rows to publish
// (a silent partition, a failover with no reset: nothing comes back, and
// something still acknowledges, so TCP never gives up) is given up after
// RoundTripTimeout, and the next pass publishes the rows on another
// connection once the server has ended the backend that held the relay's
// lock. The loop's context has no deadline.
func TestRelaySilentConnectionIsGivenUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := testkit.Pool(t)
	broker := testkit.Broker(t, testPartitions)
	proxy, proxied := pgproxy.StartFor(t, dbURL)
	cfg, err := pgxpool.ParseConfig(proxied)
	require.NoError(t, err)
	// The server never hears of the pass given up (the partition): its
	// backend keeps the relay's advisory lock until it has sat idle in its
	// transaction this long, as the consumer's connections do after
	// --db-idle-in-transaction-timeout.
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "2000"
	ppool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	r := NewRelay(ppool, newProducer(t, broker.Addr()), &RelayConfig{RoundTripTimeout: time.Second})
	proxy.SilenceAt(func(stmts []string) bool {
		for _, s := range stmts {
			if strings.Contains(s, "FROM outbox") && strings.Contains(s, "UNION ALL") {
				return true
			}
		}
		return false
	})
	commit(t, pool, row("k", 1))
	require.NoError(t, r.Start(ctx))
	t.Cleanup(r.Stop)
	// Runs first: the old relay's pass still waits on its silent
	// connection, and Stop would wait for it.
	t.Cleanup(proxy.Close)
	require.Eventually(t, func() bool { return proxy.Stats().Silenced == 1 }, waitFor, 10*time.Millisecond,
		"the pass's select is sent and its connection silenced")
	require.Eventually(t, func() bool { return unpublished(t, pool) == 0 }, waitFor, 10*time.Millisecond,
		"the relay gave the silent pass up and published the row")
	require.Len(t, readTopic(t, broker.Addr(), testTopic, 1), 1)
}
