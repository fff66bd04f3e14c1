package pgdb_test

import (
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// Migration 00019 builds its indexes CONCURRENTLY. A run cut short (the
// lock timeout, a killed migration) leaves an index invalid and the
// version unrecorded; the next run must build it again, valid, not keep
// the invalid one (CREATE INDEX ... IF NOT EXISTS would).
func TestQuarantinedIndexMigrationRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := schemaURL(t, "rerun_quarantined")
	db := openSQL(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, pgdb.Migrations())
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 19)
	require.NoError(t, err)

	// As if the run had been cut short: applied, not recorded, and each
	// index left invalid as an interrupted CREATE INDEX CONCURRENTLY
	// leaves it (here: unique builds that fail on duplicates).
	_, err = db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id = 19`)
	require.NoError(t, err)
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
		_, err = db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, sql := range []string{
		`CREATE UNIQUE INDEX CONCURRENTLY outbox_quarantined ON outbox (key) WHERE quarantine_reason IS NOT NULL`,
		`CREATE UNIQUE INDEX CONCURRENTLY inputs_quarantined ON inputs (session_id) WHERE quarantine_reason IS NOT NULL`,
		`CREATE UNIQUE INDEX CONCURRENTLY quarantine_releases_ref ON quarantine_releases (kind, ref)`,
	} {
		_, err = db.ExecContext(ctx, sql)
		require.ErrorContains(t, err, "could not create unique index", sql)
	}
	invalid := func() (names []string) {
		rows, err := db.QueryContext(ctx, `
			SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'rerun_quarantined' AND NOT i.indisvalid ORDER BY 1`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			names = append(names, n)
		}
		require.NoError(t, rows.Err())
		return names
	}
	require.Equal(t, []string{"inputs_quarantined", "outbox_quarantined", "quarantine_releases_ref"}, invalid())

	_, err = p.UpTo(ctx, 19)
	require.NoError(t, err, "the migration runs again over itself")
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, int64(19), v)
	require.Empty(t, invalid(), "every index of the migration, valid")
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = 'rerun_quarantined'
		AND indexname IN ('inputs_quarantined', 'outbox_quarantined', 'quarantine_releases_ref')`).Scan(&n))
	require.Equal(t, 3, n)
}
