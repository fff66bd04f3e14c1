package admission

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// Admission's lookups of inputs stay lookups by key whatever the size and
// the statistics of the table when their plans were made: pgx prepares
// every statement, Postgres keeps the generic plan it chooses until an
// analyze invalidates it, and a plan made while inputs was small (never
// analyzed, or analyzed at a few dozen or hundred rows) scanned the whole
// table, or the whole of its primary key, and was kept as the table grew:
// every batch then read every input (3,090 scans, 19.8 million tuples, for
// 15,000 turns of the bench's steady phase; docs/benchmarks.md, "A plan
// made on a small table"). Message IDs are UUIDv7 from the clients (time
// ordered: the planner then finds a full index scan cheap) or anything
// else; both are tried.
func TestAdmissionPlansAreIndexLookupsAtAnySize(t *testing.T) {
	t.Parallel()
	keys := map[string]string{
		"arbitrary":    `'m-' || g`,
		"time-ordered": `lpad(to_hex(g), 8, '0') || '-0000-7000-8000-' || lpad(to_hex(g), 12, '0')`,
	}
	statements := []struct{ name, params, sql string }{
		{"lock_sessions", "(text[], text[], bytea[], bool[])", lockSessionsSQL},
		{"select_existing", "(text[])", selectExistingSQL},
		{"arm", "(text[])", armSQL},
	}
	for kind, key := range keys {
		for _, size := range []int{30, 51, 100, 200, 500} {
			for _, analyzed := range []bool{false, true} {
				stage := fmt.Sprintf("%s IDs, %d inputs, analyzed %v", kind, size, analyzed)
				t.Run(stage, func(t *testing.T) {
					t.Parallel()
					pc := testkit.NewPlanConn(t)
					pc.Exec(`ALTER TABLE inputs SET (autovacuum_enabled = false)`)
					pc.Exec(`ALTER TABLE sessions SET (autovacuum_enabled = false)`)
					// Generic plans, as the plan cache ends with; one is
					// kept until an analyze, so the plan made small is the
					// one the grown table gets.
					pc.Exec(`SET plan_cache_mode = force_generic_plan`)
					fill := func(from, to int) {
						pc.Exec(fmt.Sprintf(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(%d, %d) g`, from, to))
						pc.Exec(fmt.Sprintf(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
							SELECT %s, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(%d, %d) g`, key, from, to))
					}
					fill(1, size)
					if analyzed {
						pc.Exec(`VACUUM ANALYZE inputs`)
					}
					check := func(when, name string, args string) {
						t.Helper()
						plan := pc.Explain(name, args)
						if strings.Contains(plan, "Seq Scan") || !testkit.UsesIndex(plan, "inputs_pkey") ||
							!strings.Contains(plan, "Index Cond: (message_id = ANY (") {
							t.Fatalf("%s, %s: inputs must be read by message_id through inputs_pkey:\n%s", when, name, plan)
						}
					}
					const ids = `'{a,b}'`
					args := map[string]string{
						"lock_sessions":   `(` + ids + `, '{s-1,s-2}', '{"\\x00","\\x00"}', '{t,t}')`,
						"select_existing": `(` + ids + `)`,
						"arm":             `(` + ids + `)`,
					}
					// Made as an admission transaction makes them: after
					// its settings.
					pc.Exec(`BEGIN`)
					pc.Exec(admissionSettingsSQL)
					for _, s := range statements {
						pc.Exec(`PREPARE ` + s.name + s.params + ` AS ` + s.sql)
						check("made", s.name, args[s.name])
					}
					pc.Exec(`COMMIT`)
				})
			}
		}
	}
}

// The quarantined inputs are counted for the gauge on every recovery
// pass of every process; inputs only grows (a prompt's row is its
// idempotency key), so the count must read the quarantined rows alone, not
// the table (migration 00019).
func TestCountQuarantinedInputsReadsTheQuarantinedOnly(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	pc.Exec(`ALTER TABLE inputs SET (autovacuum_enabled = false)`)
	check := func(stage, name string) {
		t.Helper()
		plan := pc.Explain(name, "")
		if strings.Contains(plan, "Seq Scan") || !testkit.UsesIndex(plan, "inputs_quarantined") {
			t.Fatalf("%s: the count must read inputs_quarantined:\n%s", stage, plan)
		}
	}
	pc.Exec(`SET plan_cache_mode = force_generic_plan`)
	pc.Exec(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(1, 20000) g`)
	pc.Exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, quarantine_reason, quarantined_at)
		SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true,
		       CASE WHEN g % 5000 = 0 THEN 'bad' END, CASE WHEN g % 5000 = 0 THEN now() END
		FROM generate_series(1, 20000) g`)
	pc.Exec(`ANALYZE inputs`)
	pc.Exec(`PREPARE count_analyzed AS ` + countQuarantinedInputsSQL)
	check("generic, planned with statistics", "count_analyzed")
}

// The plans above are made after admissionSettingsSQL run by the test;
// this one checks that admission runs it: the generic plans an Admitter's
// own connection caches, made on a small analyzed table, are index lookups
// when the table has grown.
func TestAdmitMakesItsPlansUnderItsSettings(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(testkit.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // one connection: the one whose cached plans are read
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	fill := func(from, to int) {
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(%d, %d) g;
			INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(%d, %d) g`, from, to, from, to))
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `ALTER TABLE inputs SET (autovacuum_enabled = false)`)
	require.NoError(t, err)
	fill(1, 100)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE inputs`)
	require.NoError(t, err)

	// m-1 is stored with another hash: a conflict, read under lock.
	got, err := NewAdmitter(pool, &AdmitterConfig{}).Admit(ctx, []Incoming{prompt("m-1", "s-1", "a", true), prompt("new", "s-new", "a", true)})
	require.NoError(t, err)
	require.Equal(t, []Outcome{Conflict, Admitted}, got)
	fill(101, 20000)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, s := range []struct{ sql, args string }{
		{lockSessionsSQL, `('{m-1,m-x}', '{s-1,s-x}', '{"\\x00","\\x00"}', '{t,t}')`},
		{selectExistingSQL, `('{m-1,m-2}')`},
	} {
		var name string
		require.NoError(t, conn.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement = $1`, s.sql).Scan(&name),
			"the Admitter prepared %q", s.sql)
		rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE `+pgx.Identifier{name}.Sanitize()+s.args)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index Cond: (message_id = ANY (") {
			t.Fatalf("the Admitter's cached plan must read inputs by message_id through inputs_pkey:\n%s", plan)
		}
	}
}
