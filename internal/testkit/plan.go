package testkit

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PlanConn is one connection of a fresh database, held for a test of query
// plans: settings such as plan_cache_mode and prepared statements belong
// to a connection.
type PlanConn struct {
	t    testing.TB
	conn *pgxpool.Conn
}

// NewPlanConn acquires a connection of a fresh, migrated database,
// released when the test ends.
func NewPlanConn(t testing.TB) *PlanConn {
	t.Helper()
	pool, _ := Pool(t)
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return &PlanConn{t: t, conn: conn}
}

// Exec runs sql and fails the test on an error.
func (c *PlanConn) Exec(sql string) {
	c.t.Helper()
	if _, err := c.conn.Exec(context.Background(), sql); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

// Explain returns the plan of the prepared statement name executed with
// args (a parenthesised list, or "" for none), one line per node.
func (c *PlanConn) Explain(name, args string) string {
	c.t.Helper()
	rows, err := c.conn.Query(context.Background(), `EXPLAIN (COSTS OFF) EXECUTE `+name+args)
	if err != nil {
		c.t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.Join(lines, "\n") + "\n"
}

// LooksUpIndex reports whether plan reads through index by a condition
// on its keys (an Index Cond under the index's node), not by walking the
// whole index.
func LooksUpIndex(plan, index string) bool {
	lines := strings.Split(plan, "\n")
	for i, l := range lines {
		if !UsesIndex(l+"\n", index) {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		for _, p := range lines[i+1:] {
			trimmed := strings.TrimLeft(p, " ")
			if len(p)-len(trimmed) <= indent || strings.HasPrefix(trimmed, "->") {
				break
			}
			if strings.HasPrefix(trimmed, "Index Cond:") {
				return true
			}
		}
	}
	return false
}

// UsesIndex reports whether plan reads through index (an index scan, an
// index-only scan or a bitmap index scan).
func UsesIndex(plan, index string) bool {
	for _, kind := range []string{"Index Scan using ", "Index Only Scan using ", "Bitmap Index Scan on "} {
		if strings.Contains(plan, kind+index+" ") || strings.Contains(plan, kind+index+"\n") {
			return true
		}
	}
	return false
}

// FunctionStatement returns stmt, a statement as written in the body of
// the SQL function fn (any of its overloads), with each name in subst
// replaced by its value wherever it stands as a whole word: parameters by
// $1, $2..., variables by the expression they hold. A plan test can then
// prepare it and read its plan, which EXPLAIN cannot show from outside the
// function. The test fails when fn's definition no longer contains stmt,
// whitespace aside: a copy that no longer follows its function plans a
// statement nobody runs.
func (c *PlanConn) FunctionStatement(fn, stmt string, subst map[string]string) string {
	c.t.Helper()
	var def string
	err := c.conn.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(pg_get_functiondef(oid), E'\n'), '') FROM pg_proc WHERE proname = $1`, fn).Scan(&def)
	if err != nil {
		c.t.Fatalf("reading function %s: %v", fn, err)
	}
	if def == "" {
		c.t.Fatalf("function %s does not exist", fn)
	}
	if !strings.Contains(squeeze(def), squeeze(stmt)) {
		c.t.Fatalf("function %s no longer contains the statement its plan test copies; copy it again:\n%s", fn, stmt)
	}
	for name, v := range subst {
		re := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`)
		if !re.MatchString(stmt) {
			c.t.Fatalf("%s: the statement has no %s to replace:\n%s", fn, name, stmt)
		}
		stmt = re.ReplaceAllLiteralString(stmt, v)
	}
	return stmt
}

// FunctionSettings are the settings the SQL function fn is planned and
// run with (CREATE FUNCTION ... SET), as "name=value", across its
// overloads.
func (c *PlanConn) FunctionSettings(fn string) []string {
	c.t.Helper()
	var settings []string
	err := c.conn.QueryRow(context.Background(),
		`SELECT coalesce(array_agg(s), '{}') FROM pg_proc, unnest(proconfig) s WHERE proname = $1`, fn).Scan(&settings)
	if err != nil {
		c.t.Fatalf("reading the settings of function %s: %v", fn, err)
	}
	return settings
}

var spaces = regexp.MustCompile(`\s+`)

// squeeze folds every run of whitespace into one space.
func squeeze(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }

// RequirePartsLookedUp plans each of statements (name → SQL, args as
// Explain takes them), custom and generic, on the caller's messages and
// parts (its test writes them: tables are written by their owners' code
// or by tests) under skewed statistics: a session's messages and a
// message's parts estimated a fifth of their tables (n_distinct 5), as
// statistics taken while the tables grew, or one long session, can make
// them. It fails for each plan that does not look the parts up by message
// through message_parts_pkey. Planned as a join under such statistics,
// the transcript read hashed the whole of message_parts at every read
// (docs/benchmarks.md, "A transcript read that scanned every part").
func (c *PlanConn) RequirePartsLookedUp(statements map[string][2]string) {
	c.t.Helper()
	c.Exec(`ALTER TABLE messages ALTER COLUMN session_id SET (n_distinct = 5)`)
	c.Exec(`ALTER TABLE message_parts ALTER COLUMN message_id SET (n_distinct = 5)`)
	c.Exec(`ANALYZE messages`)
	c.Exec(`ANALYZE message_parts`)
	for name, s := range statements {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			c.Exec(`SET plan_cache_mode = ` + mode)
			c.Exec(`PREPARE parts_q AS ` + s[0])
			plan := c.Explain("parts_q", s[1])
			c.Exec(`DEALLOCATE parts_q`)
			if !LooksUpIndex(plan, "message_parts_pkey") || strings.Contains(plan, "Seq Scan on message_parts") {
				c.t.Errorf("%s, %s: the parts must be looked up by message through message_parts_pkey:\n%s", name, mode, plan)
			}
		}
	}
	c.Exec(`RESET plan_cache_mode`)
}
