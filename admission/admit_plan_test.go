package admission

import (
	"fmt"
	"strings"
	"testing"

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
					// Generic plans throughout, as the plan cache ends with:
					// the checks of the cached plans must not get custom
					// plans of the moment.
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
					// The cached plans, after the table grew: nothing
					// re-plans them.
					fill(size+1, 20000)
					for _, s := range statements {
						check("kept at 20,000 inputs", s.name, args[s.name])
					}
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
