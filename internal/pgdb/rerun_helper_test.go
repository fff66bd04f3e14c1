package pgdb_test

import (
	"database/sql"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// migratedTo migrates a new schema up to version and then forgets that
// version, as a run of a migration outside a transaction that was cut
// short leaves it: applied (in part or whole), not recorded. The returned
// rerun runs the migrations up to version again and requires them to
// succeed and to record it.
func migratedTo(t *testing.T, schema string, version int64) (db *sql.DB, rerun func()) {
	t.Helper()
	db, _, rerun = migratedToURL(t, schema, version)
	return db, rerun
}

// migratedToURL is migratedTo, with the URL of the schema's database.
func migratedToURL(t *testing.T, schema string, version int64) (db *sql.DB, url string, rerun func()) {
	t.Helper()
	ctx := t.Context()
	url = schemaURL(t, schema)
	db = openSQL(t, url)
	p, err := goose.NewProvider(goose.DialectPostgres, db, pgdb.Migrations())
	require.NoError(t, err)
	_, err = p.UpTo(ctx, version)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id = $1`, version)
	require.NoError(t, err)
	return db, url, func() {
		t.Helper()
		_, err := p.UpTo(ctx, version)
		require.NoError(t, err, "the migration runs again over itself")
		v, err := pgdb.SchemaVersion(ctx, db)
		require.NoError(t, err)
		require.Equal(t, version, v)
	}
}

// indexes lists schema's indexes among names (all when names is empty)
// whose indisvalid is valid, by name.
func indexes(t *testing.T, db *sql.DB, schema string, valid bool, names ...string) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `
		SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND i.indisvalid = $2 AND (coalesce(cardinality($3::text[]), 0) = 0 OR c.relname = ANY($3))
		ORDER BY 1`, schema, valid, names)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}
