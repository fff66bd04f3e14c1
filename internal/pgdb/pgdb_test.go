package pgdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestMigrationsApplyAndAreIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testkit.DatabaseURL(t)
	// The template is migrated already; opening again must be a no-op,
	// and several concurrent opens must serialise on the advisory lock.
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: url})
			if err == nil {
				err = db.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM inputs").Scan(&n))
	require.Zero(t, n)
}

// The fallback for machines without a running server: a throwaway cluster
// from the PostgreSQL binaries, migrated and usable, removed on Stop.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The system temp directory: as root the cluster runs as "postgres",
	// which cannot enter a test's private TempDir.
	c, err := pgdb.StartCluster(ctx, "")
	require.NoError(t, err)
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: c.URL("postgres")})
	require.NoError(t, err)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n))
	require.NoError(t, db.Close())
	require.NoError(t, c.Stop())
	require.NoDirExists(t, c.Dir)
}

func TestTimeoutsAreSetPerConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: testkit.DatabaseURL(t), LockTimeout: 1500 * time.Millisecond})
	require.NoError(t, err)
	defer db.Close()
	var stmt, lock, idle string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
		current_setting('idle_in_transaction_session_timeout')`).Scan(&stmt, &lock, &idle))
	require.Equal(t, []string{"30s", "1500ms", "1min"}, []string{stmt, lock, idle})
}
