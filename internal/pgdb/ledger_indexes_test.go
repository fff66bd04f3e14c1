package pgdb_test

import (
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// TestLedgerIndexMigrationRunsAgain: migration 00010 builds its indexes
// CONCURRENTLY, outside a transaction, like 00007 (TestHotPathMigrationRunsAgain):
// a run cut short leaves some indexes built, perhaps one invalid, and no
// version recorded. The next run must succeed over them and leave every
// index valid.
func TestLedgerIndexMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := schemaURL(t, "rerun_ledger")
	db := openSQL(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, pgdb.Migrations())
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 10)
	require.NoError(t, err)

	// As if the run had been cut short: applied, not recorded, and one
	// index left invalid as an interrupted CREATE INDEX CONCURRENTLY leaves it.
	_, err = db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id = 10`)
	require.NoError(t, err)
	for _, sql := range []string{
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider, idempotency_key,
			fencing_token, request_hash, state) VALUES ('e/step-1', 's', 'e', 'a', 1, 'p', 'k', 1, '\x00', 'succeeded'),
			('e/step-2', 's', 'e', 'a', 2, 'p', 'k', 1, '\x00', 'succeeded')`,
		`DROP INDEX attempts_execution`,
	} {
		_, err = db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	// A concurrent build that fails leaves its index behind, invalid.
	_, err = db.ExecContext(ctx, `CREATE UNIQUE INDEX CONCURRENTLY attempts_execution ON attempts (execution_id)`)
	require.ErrorContains(t, err, "could not create unique index")
	var valid bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'rerun_ledger.attempts_execution'::regclass`).Scan(&valid))
	require.False(t, valid)
	_, err = p.UpTo(ctx, 10)
	require.NoError(t, err, "the migration runs again over itself")

	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, int64(10), v)
	rows, err := db.QueryContext(ctx, `
		SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'rerun_ledger' AND i.indisvalid
		  AND c.relname IN ('tool_calls_session', 'attempts_execution', 'permission_requests_call')
		ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"attempts_execution", "permission_requests_call", "tool_calls_session"}, names,
		"every index of the migration, valid")
}
