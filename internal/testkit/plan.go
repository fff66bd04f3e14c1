package testkit

import (
	"context"
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
