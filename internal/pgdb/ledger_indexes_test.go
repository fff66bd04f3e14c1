package pgdb_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLedgerIndexMigrationRunsAgain: migration 00010 builds its indexes
// CONCURRENTLY, outside a transaction, like 00007 (TestHotPathMigrationRunsAgain):
// a run cut short leaves some indexes built, perhaps one invalid, and no
// version recorded. The next run must succeed over them and leave every
// index valid.
func TestLedgerIndexMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// As if the run had been cut short: applied, not recorded, and one
	// index left invalid as an interrupted CREATE INDEX CONCURRENTLY leaves it.
	db, rerun := migratedTo(t, "rerun_ledger", 10)
	for _, sql := range []string{
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider, idempotency_key,
			fencing_token, request_hash, state) VALUES ('e/step-1', 's', 'e', 'a', 1, 'p', 'k', 1, '\x00', 'succeeded'),
			('e/step-2', 's', 'e', 'a', 2, 'p', 'k', 1, '\x00', 'succeeded')`,
		`DROP INDEX attempts_execution`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	// A concurrent build that fails leaves its index behind, invalid.
	_, err := db.ExecContext(ctx, `CREATE UNIQUE INDEX CONCURRENTLY attempts_execution ON attempts (execution_id)`)
	require.ErrorContains(t, err, "could not create unique index")
	require.Equal(t, []string{"attempts_execution"}, indexes(t, db, "rerun_ledger", false, "attempts_execution"))
	rerun()
	require.Equal(t, []string{"attempts_execution", "permission_requests_call", "tool_calls_session"},
		indexes(t, db, "rerun_ledger", true, "tool_calls_session", "attempts_execution", "permission_requests_call"),
		"every index of the migration, valid")
}
