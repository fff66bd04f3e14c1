package pgdb_test

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// migrationWaits returns the URL of a schema just behind the last
// migration that builds an index on inputs (lastInputsIndexBuild), with a
// transaction of another session holding a lock on inputs that the build
// waits for. The lock is let go once
// the server has seen the build wait for it for hold (so the migration
// takes at least that long, whatever the machine's speed), or once a
// waiter it saw is gone (cancelled by a timeout), or after a minute.
func migrationWaits(t *testing.T, schema string, hold time.Duration) string {
	t.Helper()
	ctx := t.Context()
	url := schemaURL(t, schema)
	p, err := goose.NewProvider(goose.DialectPostgres, openSQL(t, url), pgdb.Migrations())
	require.NoError(t, err)
	versions := migrationVersions(t)
	build := slices.Index(versions, lastInputsIndexBuild(t))
	require.Positive(t, build)
	_, err = p.UpTo(ctx, versions[build-1])
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	// SHARE UPDATE EXCLUSIVE conflicts with itself, which CREATE INDEX
	// CONCURRENTLY takes on the table it indexes.
	_, err = tx.Exec(ctx, `LOCK TABLE inputs IN SHARE UPDATE EXCLUSIVE MODE`)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		defer func() {
			_ = tx.Rollback(context.Background())
			_ = conn.Close(context.Background())
			_ = watch.Close(context.Background())
		}()
		seen := false
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); <-poll.C {
			var waited *float64
			if err := watch.QueryRow(context.Background(), `SELECT max(extract(epoch FROM clock_timestamp() - a.state_change))::float8
				FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE NOT l.granted AND l.relation = 'inputs'::regclass`).Scan(&waited); err != nil {
				return
			}
			switch {
			case waited != nil && *waited >= hold.Seconds():
				return
			case waited != nil:
				seen = true
			case seen:
				return // the waiter is gone: cancelled
			}
		}
	}()
	t.Cleanup(func() { <-released })
	return url
}

// lastInputsIndexBuild is the version of the last migration that builds an
// index on inputs (CREATE INDEX CONCURRENTLY ... ON inputs): the wait the
// tests below need. Migrations after it may touch other tables.
func lastInputsIndexBuild(t *testing.T) int64 {
	t.Helper()
	build := regexp.MustCompile(`(?m)^CREATE INDEX CONCURRENTLY \w+ ON inputs\b`)
	var last int64
	for _, v := range migrationVersions(t) {
		matches, err := fs.Glob(pgdb.Migrations(), fmt.Sprintf("%05d_*.sql", v))
		require.NoError(t, err)
		require.Len(t, matches, 1, "migration %d", v)
		text, err := fs.ReadFile(pgdb.Migrations(), matches[0])
		require.NoError(t, err)
		if build.Match(text) {
			last = v
		}
	}
	require.NotZero(t, last, "no migration builds an index on inputs")
	return last
}

// A consumer that migrates at start (--migrate, the default) must not cut
// a migration short at its runtime statement timeout: an index build on a
// large table takes longer than a turn's statement may, and every start
// would drop the half-built index, build it again and time out again.
// Migrations run under their own timeout, as `consumer migrate` does.
func TestMigrateAtStartOutlivesTheRuntimeStatementTimeout(t *testing.T) {
	t.Parallel()
	url := migrationWaits(t, "slow_migration", 1500*time.Millisecond)
	db, err := pgdb.Open(t.Context(), pgdb.OpenOpts{URL: url, StatementTimeout: 300 * time.Millisecond})
	require.NoError(t, err, "the migration waited longer than the runtime's statement timeout")
	defer db.Close()
	var v int64
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT max(version_id) FROM goose_db_version`).Scan(&v))
	require.Equal(t, pgdb.LatestVersion(), v)
	var stmt string
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT current_setting('statement_timeout')`).Scan(&stmt))
	require.Equal(t, "300ms", stmt, "the runtime's own connections keep the runtime's timeout")
}

// A migration that outlives even its own timeout fails the start with an
// error that says what to run, not a bare "canceling statement".
func TestMigrationPastItsTimeoutNamesTheCommand(t *testing.T) {
	t.Parallel()
	url := migrationWaits(t, "too_slow_migration", 1500*time.Millisecond)
	_, err := pgdb.Open(t.Context(), pgdb.OpenOpts{URL: url, MigrateStatementTimeout: 300 * time.Millisecond})
	require.ErrorContains(t, err, "canceling statement due to statement timeout")
	require.ErrorContains(t, err, "ran past its statement timeout (300ms)")
	require.ErrorContains(t, err, "`consumer migrate --db-statement-timeout")
}
