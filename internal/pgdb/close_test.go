package pgdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
)

// TestCloseIsBoundedWhenTheServerIsSilent: a process stops while its
// database answers nothing (a partition, a failover with no reset), its
// last statements cut off by their contexts. pgx closes each such
// connection in the background and gives it 15 s, and the pool's Close
// waited for all of them: the stop overran --shutdown-grace by that much,
// past the orchestrator's grace period. The process ends anyway, and the
// kernel closes its sockets: Close waits a bounded time.
func TestCloseIsBoundedWhenTheServerIsSilent(t *testing.T) {
	t.Parallel()
	proxy, url := pgproxy.StartFor(t, testkit.DatabaseURL(t))
	db, err := pgdb.Open(t.Context(), pgdb.OpenOpts{URL: url, NoMigrate: true})
	require.NoError(t, err)
	proxy.SilenceEvery(func([]string) bool { return true })
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = db.Pool.Exec(ctx, `SELECT 1`)
	require.Error(t, err, "the statement is cut off")

	began := time.Now()
	require.NoError(t, db.Close())
	took := time.Since(began)
	t.Logf("closed in %s", took)
	require.Less(t, took, 5*time.Second)
}
