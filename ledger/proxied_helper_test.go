package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
)

// proxiedPools is a fresh database: a pool straight to it (for the test's
// own reads and setup), the fault proxy in front of it, and a pool through
// the proxy (for the code under test), closed with the test. params are
// runtime parameters of the proxied pool's connections (lock_timeout, say).
func proxiedPools(t *testing.T, params map[string]string) (pool *pgxpool.Pool, proxy *pgproxy.Proxy, ppool *pgxpool.Pool) {
	t.Helper()
	pool, dbURL := testkit.Pool(t)
	proxy, proxied := pgproxy.StartFor(t, dbURL)
	cfg, err := pgxpool.ParseConfig(proxied)
	require.NoError(t, err)
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	ppool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	return pool, proxy, ppool
}
