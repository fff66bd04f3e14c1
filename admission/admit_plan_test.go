package admission

import (
	"strconv"
	"strings"
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// A generic plan of lockSessionsSQL made while inputs is small must still
// look the batch's IDs up by the primary key: pgx prepares the statement,
// Postgres keeps the generic plan it makes after five executions until
// something invalidates it (an analyze, which autovacuum first runs on a
// fresh database a minute or more after the table fills), and a plan that
// scanned inputs whole, made at a few dozen rows, was kept while the table
// grew: every batch then read every input (3,090 scans, 19.8 million
// tuples, for 15,000 turns of the bench's steady phase; docs/benchmarks.md,
// "A plan made on an empty table").
func TestLockSessionsPlanIsAnIndexLookupAtAnySize(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	pc.Exec(`ALTER TABLE inputs SET (autovacuum_enabled = false)`)
	fill := func(from, to int) {
		pc.Exec(`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(` + strconv.Itoa(from) + `, ` + strconv.Itoa(to) + `) g`)
		pc.Exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(` + strconv.Itoa(from) + `, ` + strconv.Itoa(to) + `) g`)
	}
	fill(1, 30)
	pc.Exec(`SET plan_cache_mode = force_generic_plan`)
	pc.Exec(`PREPARE lock_sessions(text[], text[], bytea[], bool[]) AS ` + lockSessionsSQL)
	const args = `('{m-1,m-x}', '{s-1,s-x}', '{"\\x00","\\x00"}', '{t,t}')`
	check := func(stage string) {
		t.Helper()
		plan := pc.Explain("lock_sessions", args)
		if strings.Contains(plan, "Seq Scan on inputs") || !testkit.UsesIndex(plan, "inputs_pkey") {
			t.Fatalf("%s: the batch's IDs must be looked up by inputs_pkey:\n%s", stage, plan)
		}
	}
	check("at 30 inputs")
	// The plan cached at 30 rows, after the table grew: nothing re-plans it.
	fill(31, 20000)
	check("at 20,000 inputs")
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
