package pgdb_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// 00021 was written before 00020, so a build of the history between them
// migrated databases to version 21 without 00020 (promptline_waiting_head,
// which every turn reads, and the claim's check of the queue's head). The
// next build must bring such a database to the latest schema, and a
// consumer that only checks the schema (--migrate=false) must refuse it,
// naming what is missing: it compared only the highest version, started,
// and failed every session's claim; and goose refused the missing lower
// version, so no later build could migrate it.
func TestMigrationGapOf00020(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openSQL(t, schemaURL(t, "gap_00020"))
	upWithout(t, db, "00020_")
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.Equal(t, pgdb.LatestVersion(), v, "the gap is below the latest version")

	t.Run("CheckVersionNamesAMissingMigration", func(t *testing.T) {
		err := pgdb.CheckVersion(ctx, db)
		var sv *pgdb.SchemaVersionError
		require.ErrorAs(t, err, &sv)
		require.ErrorIs(t, err, pgdb.ErrSchemaBehind)
		require.Equal(t, []int64{20}, sv.Missing)
		require.Contains(t, err.Error(), "lacks migrations [20]")
		require.Contains(t, err.Error(), "consumer migrate")
	})

	require.NoError(t, pgdb.Migrate(ctx, db), "a later build migrates a database with a gap below its version")
	require.NoError(t, pgdb.CheckVersion(ctx, db))
	// The same functions and indexes as a database migrated in order
	// (the test database's own schema): 00020 applied after 00021 changes
	// nothing 00021 wrote.
	require.Equal(t, schemaObjects(t, db, "public"), schemaObjects(t, db, "gap_00020"))
}

// upWithout applies the embedded migrations but those whose file name
// starts with skip, as a build without them did.
func upWithout(t *testing.T, db *sql.DB, skip string) {
	t.Helper()
	without := fstest.MapFS{}
	entries, err := fs.ReadDir(pgdb.Migrations(), ".")
	require.NoError(t, err)
	skipped := false
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), skip) {
			skipped = true
			continue
		}
		b, err := fs.ReadFile(pgdb.Migrations(), e.Name())
		require.NoError(t, err)
		without[e.Name()] = &fstest.MapFile{Data: b}
	}
	require.True(t, skipped, "no embedded migration %s*", skip)
	p, err := goose.NewProvider(goose.DialectPostgres, db, without)
	require.NoError(t, err)
	_, err = p.Up(t.Context())
	require.NoError(t, err)
}

// schemaObjects lists a schema's functions (their definitions) and
// indexes (theirs), the schema's name taken out.
func schemaObjects(t *testing.T, db *sql.DB, schema string) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `
SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1 AND p.prokind = 'f'
UNION ALL
SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename <> 'goose_db_version'
ORDER BY 1`, schema)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var def string
		require.NoError(t, rows.Scan(&def))
		out = append(out, strings.ReplaceAll(def, schema+".", "SCHEMA."))
	}
	require.NoError(t, errors.Join(rows.Err(), rows.Close()))
	require.Greater(t, len(out), 20, "the schema's functions and indexes")
	return out
}
