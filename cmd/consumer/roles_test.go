package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/console"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// Postgres roles (issue 8, item 3) and schema versions (item 7) on real
// processes: deployments/postgres/roles.sql applied with psql to a fresh
// database, `consumer migrate` as the owner role, the consumers as the
// runtime role with --migrate=false.

// adminURL returns the URL of the server testkit uses, as
// the user testkit connects with: pgtestdb's own role (the user of
// testkit.DatabaseURL) may create neither databases nor roles. It follows
// testkit's rule: DATABASE_URL, else 127.0.0.1:5432 as the OS user, else
// a throwaway cluster, whose superuser is "promptline" (pgdb.Cluster).
func adminURL(t *testing.T) *url.URL {
	t.Helper()
	raw := os.Getenv("DATABASE_URL")
	if raw == "" {
		u, err := url.Parse(testkit.DatabaseURL(t)) // resolves the server, as testkit does
		require.NoError(t, err)
		name := "promptline"
		if u.Port() == "5432" {
			cu, err := user.Current()
			require.NoError(t, err)
			name = cu.Username
		}
		u.User = url.User(name)
		raw = u.String()
	}
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u
}

// inDatabase returns server's URL for database db.
func inDatabase(server *url.URL, db string) string {
	u := *server
	u.Path = "/" + db
	return u.String()
}

// withUser returns rawURL with other credentials.
func withUser(t *testing.T, rawURL, name, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.User = url.UserPassword(name, password)
	return u.String()
}

// psqlPath finds psql: on PATH, else beside the newest server binaries.
func psqlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	sort.Strings(found)
	require.NotEmpty(t, found, "applying deployments/postgres/roles.sql needs psql (apt-get install postgresql-client)")
	return found[len(found)-1]
}

// rolesBundle is a fresh database with promptline's roles in it.
type rolesBundle struct {
	admin      *pgxpool.Pool // superuser, search_path = the promptline schema
	ownerRole  string
	ownerURL   string
	runtimeURL string
	consoleURL string
	// applyRoles runs roles.sql (again): after `consumer migrate` it grants
	// the column rights of tables that now exist.
	applyRoles func(t *testing.T)
}

// setupRoles creates a database and two uniquely named roles (roles are
// cluster-wide) with roles.sql, and drops them all in cleanup.
func setupRoles(t *testing.T) *rolesBundle {
	t.Helper()
	ctx := context.Background()
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	dbName := "promptline_roles_" + suffix
	b := &rolesBundle{ownerRole: "promptline_owner_" + suffix}
	runtimeRole := "promptline_app_" + suffix
	consoleRole := "promptline_console_" + suffix

	admin := adminURL(t)
	server, err := pgx.Connect(ctx, inDatabase(admin, "postgres"))
	require.NoError(t, err)
	_, err = server.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		// After the consumers' cleanups (LIFO): the database first, then
		// the roles that nothing references any more.
		for _, sql := range []string{
			"DROP DATABASE IF EXISTS " + pgx.Identifier{dbName}.Sanitize() + " WITH (FORCE)",
			"DROP ROLE IF EXISTS " + pgx.Identifier{b.ownerRole}.Sanitize(),
			"DROP ROLE IF EXISTS " + pgx.Identifier{runtimeRole}.Sanitize(),
			"DROP ROLE IF EXISTS " + pgx.Identifier{consoleRole}.Sanitize(),
		} {
			_, err := server.Exec(ctx, sql)
			require.NoError(t, err, sql)
		}
		require.NoError(t, server.Close(ctx))
	})

	dbAdmin := inDatabase(admin, dbName)
	b.applyRoles = func(t *testing.T) {
		t.Helper()
		out, err := exec.Command(psqlPath(t), "-X", "-q", "-v", "ON_ERROR_STOP=1",
			"-v", "owner_role="+b.ownerRole, "-v", "runtime_role="+runtimeRole, "-v", "console_role="+consoleRole,
			"-v", "owner_password=owner-pw", "-v", "runtime_password=runtime-pw", "-v", "console_password=console-pw",
			"-f", filepath.Join("..", "..", "deployments", "postgres", "roles.sql"), dbAdmin).CombinedOutput()
		require.NoError(t, err, "psql -f roles.sql:\n%s", out)
	}
	b.applyRoles(t)

	b.ownerURL = withUser(t, dbAdmin, b.ownerRole, "owner-pw")
	b.runtimeURL = withUser(t, dbAdmin, runtimeRole, "runtime-pw")
	b.consoleURL = withUser(t, dbAdmin, consoleRole, "console-pw")
	cfg, err := pgxpool.ParseConfig(dbAdmin)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "promptline"
	b.admin, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(b.admin.Close)
	return b
}

// requireDenied asserts that sql fails with insufficient_privilege
// ("permission denied", or "must be owner" for ALTER and DROP).
func requireDenied(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), sql)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", sql, err)
	require.Equal(t, "42501", pgErr.Code, "%s: %s", sql, pgErr.Message)
}

// TestRuntimeRole: the schema is migrated by the owner role with `consumer
// migrate`; consumers connected as the runtime role, which has no DDL
// rights, run a turn with a tool call, are killed with the call's intent
// committed, and a restarted one's recovery retries the call and finishes
// the turn; a second prompt runs straight through. The runtime role can
// neither create a table nor truncate one.
//
// It catches: a grant missing from roles.sql for anything the consumer,
// its relay or its recovery touch (the turn would fail with permission
// denied), a consumer that still runs DDL with --migrate=false, and a
// runtime role with DDL or TRUNCATE rights.
func TestRuntimeRole(t *testing.T) {
	t.Parallel()
	r := setupRoles(t)
	ctx := t.Context()

	// Before `consumer migrate`, a consumer with --migrate=false refuses
	// to start and says what to do.
	_, stderr, code := runOnce(t, "--brokers", "127.0.0.1:1", "--database-url", r.runtimeURL, "--migrate=false",
		"--metrics-addr", "127.0.0.1:0")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, fmt.Sprintf("database schema is at version 0, this binary needs version %d", pgdb.LatestVersion()))

	// A cluster hardened so that PUBLIC executes no new function: the
	// runtime role must still run the fence (roles.sql grants it).
	_, err := r.admin.Exec(ctx, `ALTER DEFAULT PRIVILEGES FOR ROLE `+pgx.Identifier{r.ownerRole}.Sanitize()+` REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC`)
	require.NoError(t, err)

	stdout, stderr, code := runOnce(t, "migrate", "--database-url", r.ownerURL)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, fmt.Sprintf("schema at version %d\n", pgdb.LatestVersion()), stdout)
	var owner string
	require.NoError(t, r.admin.QueryRow(ctx, `SELECT tableowner FROM pg_tables WHERE schemaname = 'promptline' AND tablename = 'inputs'`).Scan(&owner))
	require.Equal(t, r.ownerRole, owner, "the owner role owns what the migrations created")

	b := &testBundle{addr: testkit.Broker(t, testPartitions).Addr(), dbURL: r.runtimeURL, group: "test-" + uuid.NewString(), pool: r.admin}
	b.producer = newProducer(t, b.addr)
	b.events = readTopic(t, b.addr, "session-events")

	const session = "s-runtime-role"
	p := prompt(session, `/tool echo {"text":"x"}`)
	crashing := b.start(t, "consumer-1", faults.IdempotentToolAfterIntent, "--migrate=false", "--lease", "1s")
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))

	// Paced (--recovery-rate): the runtime role takes the fleet's tokens.
	rec := b.start(t, "consumer-2", "", append([]string{"--migrate=false", "--recovery-rate", "100"}, recoveryFlags...)...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: echo: x", turn.Text)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'succeeded' AND output = 'x'`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'continued'`, session),
		"recovery decided as the runtime role")

	straight := prompt("s-runtime-role-2", "straight")
	b.send(t, straight)
	turn = b.events.waitTurn(t, straight.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "echo: straight", turn.Text)
	require.Empty(t, findLogsAt(rec, "ERROR"), "no errors logged by the runtime-role consumer")

	// Operator commands work as the runtime role too.
	_, stderr, code = runOnce(t, "recover", "--database-url", r.runtimeURL)
	require.Equal(t, 0, code, stderr)

	conn, err := pgx.Connect(ctx, r.runtimeURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var version int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT max(version_id) FROM goose_db_version`).Scan(&version), "the runtime role reads the schema version")
	require.Equal(t, pgdb.LatestVersion(), version)
	_, err = conn.Exec(ctx, `UPDATE recovery_rate SET tokens = tokens`)
	require.NoError(t, err, "the runtime role takes recovery tokens (default table grants)")
	requireDenied(t, conn, `CREATE TABLE intruder (id int)`)
	requireDenied(t, conn, `CREATE TABLE public.intruder (id int)`)
	requireDenied(t, conn, `CREATE TEMP TABLE intruder (id int)`)
	requireDenied(t, conn, `TRUNCATE inputs`)
	requireDenied(t, conn, `ALTER TABLE inputs ADD COLUMN intruder int`)
	requireDenied(t, conn, `DROP VIEW waiting_inputs`)
	requireDenied(t, conn, fmt.Sprintf(`INSERT INTO goose_db_version (version_id, is_applied) VALUES (%d, true)`, pgdb.LatestVersion()+1))
}

// findLogsAt returns p's JSON log lines at level.
func findLogsAt(p *proc, level string) []string {
	var out []string
	for l := range strings.Lines(p.stderr.String()) {
		if strings.Contains(l, `"level":"`+level+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// TestRefusesNewerSchemaProcess: a consumer started against a database
// that a newer release migrated exits 1, naming both versions, with and
// without --migrate.
func TestRefusesNewerSchemaProcess(t *testing.T) {
	t.Parallel()
	pool, dbURL := testkit.Pool(t)
	newer := pgdb.LatestVersion() + 1
	_, err := pool.Exec(t.Context(), `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, newer)
	require.NoError(t, err)
	want := fmt.Sprintf("database schema is at version %d, newer than this binary knows (version %d)", newer, pgdb.LatestVersion())
	for _, args := range [][]string{{"--migrate=true"}, {"--migrate=false"}, {"migrate"}} {
		t.Run(strings.Trim(strings.Join(args, ""), "-"), func(t *testing.T) {
			t.Parallel()
			args := append(args, "--database-url", dbURL)
			if args[0] != "migrate" {
				args = append(args, "--brokers", "127.0.0.1:1", "--metrics-addr", "127.0.0.1:0")
			}
			_, stderr, code := runOnce(t, args...)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, want)
		})
	}
}

// TestConsoleRole: the console role of roles.sql (run again after
// `consumer migrate`, as docs/console.md says) serves every console page
// and releases a quarantined claim and a quarantined input (whose wake it
// writes) through the audited path, and can write nothing else.
//
// It catches: a console page or a release that needs a right roles.sql
// does not grant (permission denied), and a console role with more rights
// than the release needs.
func TestConsoleRole(t *testing.T) {
	t.Parallel()
	r := setupRoles(t)
	ctx := t.Context()
	_, stderr, code := runOnce(t, "migrate", "--database-url", r.ownerURL)
	require.Equal(t, 0, code, stderr)
	r.applyRoles(t)

	for _, sql := range []string{
		`INSERT INTO sessions (session_id, fencing_token) VALUES ('s-c', 1), ('s-i', 0)`,
		`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason, quarantined_at)
		 VALUES ('s-c', 'e-c', 'gone', 1, 'safe', now() - interval '1 minute', 'unknown phase "bogus"', now())`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, quarantine_reason, quarantined_at)
		 VALUES ('m-i', 's-i', 'hello', '\x00', 'queue', true, 'repaired by hand', now())`,
	} {
		_, err := r.admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}

	pool, err := pgxpool.New(ctx, r.consoleURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv, err := console.New(pool, &console.Config{Token: consoleToken})
	require.NoError(t, err)
	for _, path := range []string{"/sessions", "/sessions?state=quarantined", "/sessions?q=m-i", "/session?id=s-c",
		"/timeline.svg?id=s-i", "/quarantine", "/recovery"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+consoleToken)
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code, "%s: %s", path, w.Body.String())
	}
	require.NoError(t, recovery.Release(ctx, pool, recovery.KindClaim, "s-c", &recovery.ReleaseOpts{Operator: "console-role"}))
	require.NoError(t, recovery.Release(ctx, pool, recovery.KindInput, "m-i", &recovery.ReleaseOpts{Operator: "console-role", Note: "n"}))
	var released, wakes int
	require.NoError(t, r.admin.QueryRow(ctx, `SELECT count(*) FROM quarantine_releases WHERE released_by = 'console-role'`).Scan(&released))
	require.Equal(t, 2, released)
	require.NoError(t, r.admin.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE key = 's-i'`).Scan(&wakes))
	require.Equal(t, 1, wakes, "the released input's wake")

	conn, err := pgx.Connect(ctx, r.consoleURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	requireDenied(t, conn, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending) VALUES ('x', 's-i', 'x', '\x00', 'queue', true)`)
	requireDenied(t, conn, `UPDATE claims SET phase = 'ready'`)
	requireDenied(t, conn, `UPDATE sessions SET fencing_token = 99`)
	requireDenied(t, conn, `UPDATE inputs SET text = 'changed'`)
	requireDenied(t, conn, `DELETE FROM outbox`)
	requireDenied(t, conn, `DELETE FROM quarantine_releases`)
	requireDenied(t, conn, `TRUNCATE inputs`)
	requireDenied(t, conn, `UPDATE recovery_rate SET tokens = tokens`)
	requireDenied(t, conn, `CREATE TABLE intruder (id int)`)
}
