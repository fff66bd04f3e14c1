package ledger_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// ledgerStatements are the statements on attempts and tool_calls, wherever
// they live (ledger, recovery, pipeline, inspect): each must reach its rows
// through an index, never by scanning the table. At 1 M ledger rows a scan
// costs 177-245 ms (migration 00010, docs/benchmarks.md); recovery runs
// several per claim, and a failed turn one while it holds the session lock.
// The SQL of other packages is copied here (they keep it unexported); a
// change there should change it here.
var ledgerStatements = []struct{ name, sql, args string }{
	// recovery.gather
	{"recovery: attempts of the execution",
		`SELECT attempt_id, step, provider, state, coalesce(model, ''), coalesce(request_tokens, 0), coalesce(response_id, '')
		FROM attempts WHERE execution_id = $1 ORDER BY step`, `('e42')`},
	{"recovery: unsettled calls of the session",
		`SELECT call_id, attempt_id, tool, class, state FROM tool_calls
		WHERE session_id = $1 AND state IN ('requested', 'started') ORDER BY requested_at, call_id`, `('s42')`},
	// recovery.decide and reconcile
	{"recovery: re-arm idempotent calls",
		`UPDATE tool_calls SET state = 'requested', started_at = NULL
		WHERE session_id = $1 AND state = 'started' AND class = 'idempotent'`, `('s42')`},
	{"recovery: settle deferred attempts",
		`UPDATE attempts SET state = 'failed', error = coalesce(error, '') || '; not sent: continued by recovery', finished_at = now()
		WHERE execution_id = $1 AND state = 'retry_wait'`, `('e42')`},
	{"recovery: reconcile attempts",
		`UPDATE attempts SET state = 'unknown', error = $2, finished_at = now()
		WHERE execution_id = $1 AND state IN ('started', 'retry_wait')`, `('e42', 'x')`},
	{"recovery: reconcile calls",
		`UPDATE tool_calls SET state = CASE state WHEN 'started' THEN 'unknown' ELSE 'interrupted' END,
		output = CASE state WHEN 'started' THEN $2 ELSE 'interrupted: never dispatched' END, is_error = true, finished_at = now()
		WHERE session_id = $1 AND state IN ('requested', 'started')`, `('s42', 'x')`},
	// pipeline.failTurn and continueTurn
	{"pipeline: interrupt calls of a failed turn",
		`UPDATE tool_calls SET state = 'interrupted', output = $2, is_error = true, finished_at = now()
		WHERE session_id = $1 AND state = 'requested'`, `('s42', 'x')`},
	{"pipeline: requested calls of a continuation",
		`SELECT call_id, attempt_id, idx, model_call_id, tool, class, input, idempotency_key
		FROM tool_calls WHERE session_id = $1 AND state = 'requested' ORDER BY requested_at, attempt_id, idx`, `('s42')`},
	{"pipeline: retry attempt's key",
		`SELECT idempotency_key FROM attempts WHERE attempt_id = $1`, `('e42/step-1')`},
	{"pipeline: permission resume",
		`SELECT a.assistant_message_id FROM permission_requests r
		JOIN tool_calls c ON c.call_id = r.call_id JOIN attempts a ON a.attempt_id = c.attempt_id
		WHERE r.request_id = $1 AND r.session_id = $2`, `('r42', 's42')`},
	// internal/inspect (session show)
	{"inspect: attempts",
		`SELECT attempt_id, execution_id, assistant_message_id, step, provider, state, tries, idempotency_key, fencing_token,
		error, input_tokens, output_tokens, model, request_tokens, response_id, started_at, next_retry_at, finished_at
		FROM attempts WHERE session_id = $1 ORDER BY started_at, step, attempt_id`, `('s42')`},
	{"inspect: tool calls",
		`SELECT c.call_id, c.attempt_id, c.execution_id, c.idx, c.model_call_id, c.tool, c.class, c.state, c.idempotency_key,
		c.fencing_token, c.is_error, c.output, c.requested_at, c.started_at, c.finished_at
		FROM tool_calls c JOIN attempts a ON a.attempt_id = c.attempt_id AND a.session_id = c.session_id
		WHERE c.session_id = $1 ORDER BY a.started_at, a.step, c.attempt_id, c.idx`, `('s42')`},
	// ledger
	{"ledger: open calls of an attempt", ledger.OpenCallsSQL, `('e42/step-1')`},
	{"ledger: finish attempt", ledger.FinishAttemptSQL, `('e42/step-1', 'failed', 'x', 0, 0, 'r1')`},
	{"ledger: record a response ID", ledger.RecordResponseIDSQL, `('e42/step-1', 1, 'r1')`},
	// recovery's pass (promptline_provider_tokens_at_risk): the partial
	// index attempts_unknown, never the ledger.
	{"ledger: attempts at risk", ledger.AttemptsAtRiskSQL, ``},
	{"ledger: prune a batch", ledger.PruneSQL, fmt.Sprintf(`('e42', 500, 86400000, %d)`, ledger.PruneLockKey)},
}

// functionStatements are statements on the ledger that run inside the
// hot path's SQL functions, copied as the function's body has them
// (testkit.PlanConn.FunctionStatement checks that it still does), their
// parameters numbered as subst says. A statement written in a function is
// planned where EXPLAIN does not reach from outside it.
var functionStatements = []struct {
	name, fn, prefix, stmt string
	subst                  map[string]string
	args                   string
}{
	{name: "promptline_step_calls, promptline_turn_answer: the attempt's success", fn: "promptline_step_calls",
		stmt: `UPDATE attempts SET state = 'succeeded', error = NULL, input_tokens = p_input_tokens, output_tokens = p_output_tokens,
		finished_at = now(),
		response_id = coalesce(response_id, nullif(p_response_id, '')),
		response_id_at = CASE WHEN response_id IS NULL AND p_response_id <> '' THEN now() ELSE response_id_at END
		WHERE attempt_id = p_attempt`,
		subst: map[string]string{"p_attempt": "$1", "p_input_tokens": "$2", "p_output_tokens": "$3", "p_response_id": "$4"},
		args:  `('e42/step-1', 1, 2, 'r1')`},
	{name: "promptline_turn_answer_writes_group: the attempts' success", fn: "promptline_turn_answer_writes_group",
		stmt: `UPDATE attempts SET state = 'succeeded', error = NULL, input_tokens = a.input_tokens, output_tokens = a.output_tokens,
		finished_at = now(),
		response_id = coalesce(attempts.response_id, nullif(a.response_id, '')),
		response_id_at = CASE WHEN attempts.response_id IS NULL AND a.response_id <> '' THEN now() ELSE attempts.response_id_at END
		FROM unnest(p_attempt, p_input_tokens, p_output_tokens, p_response_id) AS a(attempt_id, input_tokens, output_tokens, response_id)
		WHERE attempts.attempt_id = ANY (p_attempt) AND attempts.attempt_id = a.attempt_id`,
		subst: map[string]string{"p_attempt": "$1::text[]", "p_input_tokens": "$2::bigint[]", "p_output_tokens": "$3::bigint[]", "p_response_id": "$4::text[]"},
		args:  `(ARRAY['e42/step-1', 'e43/step-1'], ARRAY[1, 2]::bigint[], ARRAY[2, 3]::bigint[], ARRAY['r1', ''])`},
	{name: "promptline_call_start: the call started", fn: "promptline_call_start",
		stmt:  `UPDATE tool_calls SET state = 'started', started_at = now() WHERE call_id = p_call AND state = 'requested'`,
		subst: map[string]string{"p_call": "$1"}, args: `('c42')`},
	{name: "promptline_call_settle: the call settled", fn: "promptline_call_settle",
		stmt: `UPDATE tool_calls SET state = p_state, output = p_output, is_error = p_is_error, finished_at = now()
		WHERE call_id = p_call AND state IN ('requested', 'started')`,
		subst: map[string]string{"p_call": "$1", "p_state": "$2", "p_output": "$3", "p_is_error": "$4"},
		args:  `('c42', 'succeeded', 'x', false)`},
	{name: "promptline_call_settle: the attempt's open calls", fn: "promptline_call_settle",
		prefix: `SELECT count(*), count(*) FILTER (WHERE state = 'started') `,
		stmt:   `FROM tool_calls WHERE attempt_id = p_attempt AND state IN ('requested', 'started')`,
		subst:  map[string]string{"p_attempt": "$1"}, args: `('e42/step-1')`},
}

// ledgerSettings are the settings a statement's transaction plans it with.
var ledgerSettings = map[string]string{
	"ledger: prune a batch": strings.Replace(ledger.PruneSettingsSQL, "SET LOCAL", "SET", 1),
	// As its function is planned (TestPerSessionStatementsUseSessionIndexes
	// holds the function to the setting).
	"promptline_turn_answer_writes_group: the attempts' success": "SET enable_seqscan = off",
}

// ledgerLookups are the indexes statements must look their rows up
// through, by name.
var ledgerLookups = map[string]string{
	"promptline_turn_answer_writes_group: the attempts' success": "attempts_pkey",
}

var seqScanOfLedger = regexp.MustCompile(`Seq Scan on (attempts|tool_calls|permission_requests)\b`)

// TestLedgerStatementsUseIndexes fails when a statement on the ledger
// scans a ledger table. Plans are checked before and after ANALYZE,
// generic (as prepared statements end up) and custom, and as cached on
// empty tables, as TestPerSessionStatementsUseSessionIndexes does for the
// executor's hot path.
func TestLedgerStatementsUseIndexes(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	exec := pc.Exec
	ledgerStatements := slices.Clone(ledgerStatements)
	for _, f := range functionStatements {
		ledgerStatements = append(ledgerStatements, struct{ name, sql, args string }{
			f.name, f.prefix + pc.FunctionStatement(f.fn, f.stmt, f.subst), f.args})
	}
	for _, table := range []string{"sessions", "attempts", "tool_calls", "permission_requests", "claims", "inputs", "recoveries"} {
		exec(`ALTER TABLE ` + table + ` SET (autovacuum_enabled = false)`)
	}
	explain := pc.Explain
	// with runs fn under the statement's settings, if any.
	with := func(i int, fn func()) {
		t.Helper()
		if s := ledgerSettings[ledgerStatements[i].name]; s != "" {
			exec(s)
			defer exec(`RESET ALL`)
		}
		fn()
	}
	check := func(stage, name string, i int, mode string) {
		t.Helper()
		s := ledgerStatements[i]
		with(i, func() {
			exec(`SET plan_cache_mode = ` + mode)
			plan := explain(name, s.args)
			if seqScanOfLedger.MatchString(plan) {
				t.Errorf("%s, %s: the plan scans a ledger table:\n%s", stage, s.name, plan)
			}
			// Planned with sequential scans off, a statement could
			// still walk a whole index: it must look its rows up.
			if idx := ledgerLookups[s.name]; idx != "" && !testkit.LooksUpIndex(plan, idx) {
				t.Errorf("%s, %s: the plan does not look rows up through %s:\n%s", stage, s.name, idx, plan)
			}
		})
	}

	for i, s := range ledgerStatements {
		exec(fmt.Sprintf(`PREPARE cached%d AS %s`, i, s.sql))
		with(i, func() {
			exec(`SET plan_cache_mode = force_generic_plan`)
			explain(fmt.Sprintf("cached%d", i), s.args)
		})
	}
	// 2,000 sessions, 100,000 attempts of 20,000 executions, 200,000 tool
	// calls, 2,000 permission requests.
	exec(`INSERT INTO sessions (session_id) SELECT 's' || g FROM generate_series(1, 2000) g`)
	exec(`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
			idempotency_key, fencing_token, request_hash, state, finished_at)
		SELECT 'e' || (g % 20000) || '/step-' || g, 's' || (g % 2000 + 1), 'e' || (g % 20000), 'a' || g, g, 'p',
			'k' || g, 1, '\x00', 'succeeded', now() FROM generate_series(1, 100000) g`)
	exec(`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
			input, idempotency_key, fencing_token, state, finished_at)
		SELECT 'c' || g || '-' || i, 'e' || (g % 20000) || '/step-' || g, 's' || (g % 2000 + 1), 'e' || (g % 20000), i,
			'm', 't', 'idempotent', '{}', 'k', 1, 'succeeded', now()
		FROM generate_series(1, 100000) g, generate_series(0, 1) i`)
	exec(`INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
		SELECT 'r' || g, 's' || (g % 2000 + 1), 'c' || g || '-0', 't', '*', 'approved' FROM generate_series(1, 2000) g`)

	fresh := func(stage string) {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			for i, s := range ledgerStatements {
				name := fmt.Sprintf("p%d_%s", i, mode)
				exec(`PREPARE ` + name + ` AS ` + s.sql)
				check(stage+", "+mode, name, i, mode)
				exec(`DEALLOCATE ` + name)
			}
		}
	}
	for i := range ledgerStatements {
		check("plan cached on empty tables", fmt.Sprintf("cached%d", i), i, "force_generic_plan")
	}
	fresh("without statistics")
	exec(`ANALYZE sessions, attempts, tool_calls, permission_requests, claims, inputs, recoveries`)
	fresh("after ANALYZE")
}
