package admission

import (
	"strconv"
	"strings"
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// Admission's lookups of inputs stay lookups by key whatever the size and
// the statistics of the table when their plans were made: pgx prepares
// every statement, Postgres keeps the generic plan it makes after five
// executions until an analyze invalidates it, and a plan made while inputs
// was small (never analyzed, or analyzed at a few dozen rows) scanned the
// whole table, kept as the table grew: every batch then read every input
// (3,090 scans, 19.8 million tuples, for 15,000 turns of the bench's
// steady phase; docs/benchmarks.md, "A plan made on a small table").
func TestAdmissionPlansAreIndexLookupsAtAnySize(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	pc.Exec(`ALTER TABLE inputs SET (autovacuum_enabled = false)`)
	pc.Exec(`ALTER TABLE sessions SET (autovacuum_enabled = false)`)
	// Generic plans throughout, as the plan cache ends with: the checks of
	// the cached plans below must not get custom plans of the moment.
	pc.Exec(`SET plan_cache_mode = force_generic_plan`)
	fill := func(from, to int) {
		pc.Exec(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(` + strconv.Itoa(from) + `, ` + strconv.Itoa(to) + `) g`)
		pc.Exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(` + strconv.Itoa(from) + `, ` + strconv.Itoa(to) + `) g`)
	}
	statements := []struct{ name, params, sql, args string }{
		{"lock_sessions", "(text[], text[], bytea[], bool[])", lockSessionsSQL, `('{m-1,m-x}', '{s-1,s-x}', '{"\\x00","\\x00"}', '{t,t}')`},
		{"select_existing", "(text[])", selectExistingSQL, `('{m-1,m-2}')`},
		{"arm", "(text[])", armSQL, `('{m-1,m-2}')`},
	}
	check := func(stage, name, args string) {
		t.Helper()
		plan := pc.Explain(name, args)
		if strings.Contains(plan, "Seq Scan") || !testkit.UsesIndex(plan, "inputs_pkey") || !strings.Contains(plan, "Index Cond: (message_id = ") {
			t.Fatalf("%s, %s: inputs must be read by message_id through inputs_pkey:\n%s", stage, name, plan)
		}
	}
	// Plans made as an admission transaction makes them: after its
	// settings, as generic plans (what the plan cache ends with).
	prepare := func(stage, suffix string) {
		t.Helper()
		pc.Exec(`BEGIN`)
		pc.Exec(admissionSettingsSQL)
		for _, s := range statements {
			pc.Exec(`PREPARE ` + s.name + suffix + s.params + ` AS ` + s.sql)
			check(stage, s.name+suffix, s.args)
		}
		pc.Exec(`COMMIT`)
	}
	fill(1, 30)
	prepare("30 inputs, never analyzed", "_fresh")
	fill(31, 60)
	pc.Exec(`ANALYZE inputs`)
	pc.Exec(`ANALYZE sessions`)
	prepare("60 inputs, analyzed", "_small")
	// The cached plans, after the table grew: nothing re-plans them.
	fill(61, 20000)
	for _, suffix := range []string{"_fresh", "_small"} {
		for _, s := range statements {
			check("20,000 inputs, planned small", s.name+suffix, s.args)
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
	pc.Exec(`PREPARE count_early AS ` + countQuarantinedInputsSQL)
	pc.Explain("count_early", "") // the generic plan, made on the empty table
	pc.Exec(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(1, 20000) g`)
	pc.Exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, quarantine_reason, quarantined_at)
		SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true,
		       CASE WHEN g % 5000 = 0 THEN 'bad' END, CASE WHEN g % 5000 = 0 THEN now() END
		FROM generate_series(1, 20000) g`)
	pc.Exec(`ANALYZE inputs`)
	pc.Exec(`PREPARE count_analyzed AS ` + countQuarantinedInputsSQL)
	check("generic, planned with statistics", "count_analyzed")
	// Planned before the table had statistics, the count scans it (the
	// planner takes a few hundred rows for a quarantine); the analyze
	// that autovacuum runs as the table fills invalidates that plan.
	check("generic, planned before the analyze, used after it", "count_early")
}
