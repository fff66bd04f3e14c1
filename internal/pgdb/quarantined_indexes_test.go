package pgdb_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Migration 00019 builds its indexes CONCURRENTLY. A run cut short (the
// lock timeout, a killed migration) leaves an index invalid and the
// version unrecorded; the next run must build it again, valid, not keep
// the invalid one (CREATE INDEX ... IF NOT EXISTS would).
func TestQuarantinedIndexMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// As if the run had been cut short: applied, not recorded, and each
	// index left invalid as an interrupted CREATE INDEX CONCURRENTLY
	// leaves it (here: unique builds that fail on duplicates).
	db, rerun := migratedTo(t, "rerun_quarantined", 19)
	for _, sql := range []string{
		`INSERT INTO outbox (topic, key, payload, quarantine_reason, quarantined_at) VALUES ('t', 'k', '\x00', 'r', now()), ('t', 'k', '\x00', 'r', now())`,
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, quarantine_reason, quarantined_at)
			VALUES ('m-1', 's', 'x', '\x00', 'queue', true, 'r', now()), ('m-2', 's', 'x', '\x00', 'queue', true, 'r', now())`,
		`INSERT INTO quarantine_releases (kind, ref, reason, released_by)
			VALUES ('input', 'm-0', 'r', 'op'), ('input', 'm-0', 'r', 'op')`,
		`DROP INDEX outbox_quarantined`,
		`DROP INDEX inputs_quarantined`,
		`DROP INDEX quarantine_releases_ref`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, sql := range []string{
		`CREATE UNIQUE INDEX CONCURRENTLY outbox_quarantined ON outbox (key) WHERE quarantine_reason IS NOT NULL`,
		`CREATE UNIQUE INDEX CONCURRENTLY inputs_quarantined ON inputs (session_id) WHERE quarantine_reason IS NOT NULL`,
		`CREATE UNIQUE INDEX CONCURRENTLY quarantine_releases_ref ON quarantine_releases (kind, ref)`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.ErrorContains(t, err, "could not create unique index", sql)
	}
	ours := []string{"inputs_quarantined", "outbox_quarantined", "quarantine_releases_ref"}
	require.Equal(t, ours, indexes(t, db, "rerun_quarantined", false))

	rerun()
	require.Empty(t, indexes(t, db, "rerun_quarantined", false), "every index of the migration, valid")
	require.Equal(t, ours, indexes(t, db, "rerun_quarantined", true, ours...))
}
