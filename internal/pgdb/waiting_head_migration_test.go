package pgdb_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Migration 00020 builds its indexes CONCURRENTLY. A run cut short leaves
// an index invalid and the version unrecorded; the next run must build it
// again, valid, and re-create its functions over themselves.
func TestWaitingHeadMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, rerun := migratedTo(t, "rerun_waiting_head", 20)
	ours := []string{"inputs_waiting_internal", "inputs_waiting_steers"}
	for _, sql := range []string{
		`DROP INDEX inputs_waiting_steers`,
		`DROP INDEX inputs_waiting_internal`,
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ('m-1', 's', 'x', '\x00', 'steer', true, 'prompt'), ('m-2', 's', 'x', '\x00', 'steer', true, 'prompt'),
			       ('c-1', 's', 'x', '\x00', 'queue', true, 'continuation'), ('c-2', 's', 'x', '\x00', 'queue', true, 'continuation')`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	// Left invalid as an interrupted CREATE INDEX CONCURRENTLY leaves
	// them: here, unique builds that fail on the duplicate sessions.
	for _, sql := range []string{
		`CREATE UNIQUE INDEX CONCURRENTLY inputs_waiting_steers ON inputs (session_id)
			WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL AND delivery = 'steer'`,
		`CREATE UNIQUE INDEX CONCURRENTLY inputs_waiting_internal ON inputs (session_id)
			WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL AND kind <> 'prompt'`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.ErrorContains(t, err, "could not create unique index", sql)
	}
	require.Equal(t, ours, indexes(t, db, "rerun_waiting_head", false, ours...))

	rerun()
	require.Empty(t, indexes(t, db, "rerun_waiting_head", false, ours...), "every index of the migration, valid")
	require.Equal(t, ours, indexes(t, db, "rerun_waiting_head", true, ours...))
	var head string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT array_agg(message_id ORDER BY admission_seq)::text FROM promptline_waiting_head('s')`).Scan(&head))
	require.Equal(t, "{m-1,m-2,c-1}", head, "the oldest, the steers, the first input that is not a prompt")
}
