package pgdb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations returns the embedded migration files.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// MigrationsHash identifies the migration set (pgtestdb keys its template
// databases on it).
func MigrationsHash() string {
	h := sha256.New()
	entries, _ := fs.ReadDir(Migrations(), ".")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		b, _ := fs.ReadFile(Migrations(), n)
		fmt.Fprintf(h, "%s:%d:", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// LatestVersion is the highest embedded migration: the schema version this
// binary is written against.
func LatestVersion() int64 {
	vs := embeddedVersions()
	return vs[len(vs)-1]
}

var (
	// ErrSchemaTooNew says that a newer promptline migrated the database:
	// this binary does not know the newer tables and columns, and
	// migrations are forward-only, so it must not run against them.
	ErrSchemaTooNew = errors.New("database schema is newer than this binary")
	// ErrSchemaBehind says that migrations are pending and this process
	// was told not to apply them.
	ErrSchemaBehind = errors.New("database schema is behind this binary")
)

// SchemaVersionError is a database schema version this binary cannot run
// against. It unwraps to ErrSchemaTooNew or ErrSchemaBehind.
type SchemaVersionError struct {
	Database int64 // highest migration applied to the database; 0: none
	Binary   int64 // highest migration embedded in this binary
	// Missing are embedded migrations below Database that the database
	// lacks (see CheckVersion).
	Missing []int64
}

func (e *SchemaVersionError) Error() string {
	if len(e.Missing) > 0 && e.Database <= e.Binary {
		return fmt.Sprintf("database schema is at version %d but lacks migrations %v below it, which this binary needs: "+
			"apply them (`consumer migrate`, as the schema owner role)", e.Database, e.Missing)
	}
	if e.Database > e.Binary {
		return fmt.Sprintf("database schema is at version %d, newer than this binary knows (version %d): "+
			"a newer promptline has migrated it; run that release or a later one (migrations are forward-only)",
			e.Database, e.Binary)
	}
	return fmt.Sprintf("database schema is at version %d, this binary needs version %d: "+
		"apply the migrations first (`consumer migrate`, as the schema owner role)", e.Database, e.Binary)
}

func (e *SchemaVersionError) Unwrap() error {
	if e.Database > e.Binary {
		return ErrSchemaTooNew
	}
	return ErrSchemaBehind
}

// versionTable is goose's bookkeeping table (its default name), resolved
// through the search_path as goose resolves it.
const versionTable = "goose_db_version"

// SchemaVersion returns the highest migration applied to the database, 0
// when none (goose's table does not exist yet). It only reads, so that the
// runtime role, which may not create goose's table, can ask.
func SchemaVersion(ctx context.Context, db *sql.DB) (int64, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('`+versionTable+`') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("reading the schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT max(version_id) FROM `+versionTable).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading the schema version: %w", err)
	}
	return v.Int64, nil
}

// CheckVersion returns a *SchemaVersionError unless the database schema is
// exactly at LatestVersion with every embedded migration applied. It
// applies nothing. The highest version alone is not enough: a database
// migrated by a build of this repository's history between 00021 and
// 00020 (00021 was written first, 00020 after it) is at version 21
// without 00020's promptline_waiting_head, which every turn reads; a
// consumer that only compared the highest version started against it and
// failed every session's claim (TestCheckVersionNamesAMissingMigration).
func CheckVersion(ctx context.Context, db *sql.DB) error {
	v, err := SchemaVersion(ctx, db)
	if err != nil {
		return err
	}
	if v != LatestVersion() {
		return &SchemaVersionError{Database: v, Binary: LatestVersion()}
	}
	missing, err := missingVersions(ctx, db)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &SchemaVersionError{Database: v, Binary: LatestVersion(), Missing: missing}
	}
	return nil
}

// missingVersions lists the embedded migrations the database has not
// applied, in order. It only reads goose's table, as SchemaVersion does,
// in one query: goose's Provider.Status asks for each migration apart (a
// query per version) and fails where the table does not exist yet, which
// CheckVersion reports as version 0.
func missingVersions(ctx context.Context, db *sql.DB) ([]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT DISTINCT version_id FROM `+versionTable+` WHERE is_applied`)
	if err != nil {
		return nil, fmt.Errorf("reading the applied migrations: %w", err)
	}
	applied := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading the applied migrations: %w", err)
		}
		applied[v] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("reading the applied migrations: %w", err)
	}
	var missing []int64
	for _, v := range embeddedVersions() {
		if !applied[v] {
			missing = append(missing, v)
		}
	}
	return missing, nil
}

// embeddedVersions are the embedded migrations' versions, in order.
func embeddedVersions() []int64 {
	entries, _ := fs.ReadDir(Migrations(), ".")
	var vs []int64
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			panic(fmt.Sprintf("migration %s: %v", e.Name(), err)) // caught by every test that migrates
		}
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// Migrate applies the pending migrations with goose. A Postgres session
// advisory lock serialises concurrent starts, so several consumers may boot
// at once. A database migrated by a newer binary is refused with a
// *SchemaVersionError (goose itself would report nothing pending).
func Migrate(ctx context.Context, db *sql.DB) error {
	_, _, err := migrate(ctx, db)
	return err
}

// migrate applies the pending migrations and returns the schema versions
// before and after.
func migrate(ctx context.Context, db *sql.DB) (from, to int64, err error) {
	from, err = SchemaVersion(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	if from > LatestVersion() {
		return from, from, &SchemaVersionError{Database: from, Binary: LatestVersion()}
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return from, from, fmt.Errorf("migrations: %w", err)
	}
	// Out of order: a migration missing below the database's version is
	// applied, not refused. Only one such gap exists, 00020 missing from
	// databases migrated by a build between 00021 and 00020 (see
	// CheckVersion), and 00020 runs again safely (its indexes dropped and
	// built again, its functions replaced). Refused, such a database could
	// not be migrated by any later build. A migration must therefore not
	// assume that those numbered above it have not run.
	p, err := goose.NewProvider(goose.DialectPostgres, db, Migrations(), goose.WithSessionLocker(locker),
		goose.WithAllowOutofOrder(true))
	if err != nil {
		return from, from, fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return from, from, fmt.Errorf("applying migrations: %w", err)
	}
	if err := restrictVersionTable(ctx, db); err != nil {
		return from, from, err
	}
	to, err = SchemaVersion(ctx, db)
	if err == nil && to > LatestVersion() {
		// A newer binary migrated between the check and the lock.
		err = &SchemaVersionError{Database: to, Binary: LatestVersion()}
	}
	return from, to, err
}

// writersOfVersionTable lists the roles other than its owner that may
// write goose's table, when the current role owns it.
const writersOfVersionTable = `
SELECT DISTINCT r.rolname FROM pg_class c
CROSS JOIN LATERAL aclexplode(c.relacl) a
JOIN pg_roles r ON r.oid = a.grantee
WHERE c.oid = to_regclass('` + versionTable + `')
  AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
  AND a.grantee <> c.relowner
  AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')`

// restrictVersionTable takes writes on goose's table back from every role
// but its owner. deployments/postgres/roles.sql grants the runtime role
// row writes on every table the owner creates, goose's included; the
// runtime role only needs to read the schema version, and one that could
// write it could make every consumer refuse to start.
func restrictVersionTable(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, writersOfVersionTable)
	if err != nil {
		return fmt.Errorf("restricting %s: %w", versionTable, err)
	}
	var roles []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			rows.Close()
			return fmt.Errorf("restricting %s: %w", versionTable, err)
		}
		roles = append(roles, r)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("restricting %s: %w", versionTable, err)
	}
	for _, r := range roles {
		if _, err := db.ExecContext(ctx, `REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON `+versionTable+
			` FROM `+pgx.Identifier{r}.Sanitize()); err != nil {
			return fmt.Errorf("restricting %s: %w", versionTable, err)
		}
	}
	return nil
}

// MigratePool applies the migrations through a pool's configuration, each
// statement under MigrateStatementTimeoutDefault.
func MigratePool(ctx context.Context, pool *pgxpool.Pool) error {
	_, _, err := migratePool(ctx, pool, MigrateStatementTimeoutDefault)
	return err
}

// migratePool applies the migrations through a pool's configuration with
// the statement timeout replaced by timeout. A statement cancelled by it
// fails with advice to run `consumer migrate` with a longer one: the
// operator otherwise sees a bare "canceling statement" at every start. A
// lock not granted in time (lock_timeout, or a migration's own bound) is
// advised likewise: the migration changed nothing and runs again.
func migratePool(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) (from, to int64, err error) {
	cc := pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["statement_timeout"] = ms(timeout)
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	from, to, err = migrate(ctx, db)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil:
		err = fmt.Errorf("%w: a migration ran past its statement timeout (%s); apply the migrations with "+
			"`consumer migrate --db-statement-timeout DURATION` (a longer one) as the schema owner role, then start again", err, timeout)
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		err = fmt.Errorf("%w: a migration waited too long for a lock behind live transactions, and changed nothing; "+
			"run `consumer migrate` again once no long transaction holds its tables, then start again", err)
	}
	return from, to, err
}

// CheckPool is CheckVersion through a pool's configuration.
func CheckPool(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDB(*pool.Config().ConnConfig)
	defer db.Close()
	return CheckVersion(ctx, db)
}
