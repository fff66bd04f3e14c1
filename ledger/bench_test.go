package ledger_test

import (
	"context"
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// BenchmarkLedgerAtOneMillionRows measures, at 1 M attempts and 1 M tool
// calls (10,000 sessions, 100,000 executions), recovery's evidence reads of
// one claim and a failed turn's update of its session's calls, with the
// indexes of migration 00010 and then without them (dropped), as before it.
// The rows are written once, inside the benchmark only (go test -bench;
// the default test run never fills them):
//
//	go test -run '^$' -bench LedgerAtOneMillionRows -benchtime 20x ./ledger/
func BenchmarkLedgerAtOneMillionRows(b *testing.B) {
	ctx := context.Background()
	pool, _ := testkit.Pool(b)
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatal(sql, err)
		}
	}
	exec(`INSERT INTO sessions (session_id) SELECT 's' || g FROM generate_series(1, 10000) g`)
	exec(`INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
			idempotency_key, fencing_token, request_hash, state, finished_at)
		SELECT 'e' || (g % 100000) || '/step-' || g, 's' || (g % 10000 + 1), 'e' || (g % 100000), 'a' || g, g, 'p',
			'k' || g, 1, '\x00', 'succeeded', now() FROM generate_series(1, 1000000) g`)
	exec(`INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
			input, idempotency_key, fencing_token, state, finished_at)
		SELECT 'c' || g, 'e' || (g % 100000) || '/step-' || g, 's' || (g % 10000 + 1), 'e' || (g % 100000), 0,
			'm', 't', 'idempotent', '{}', 'k', 1, 'succeeded', now() FROM generate_series(1, 1000000) g`)
	exec(`ANALYZE attempts, tool_calls`)

	evidence := func(b *testing.B) {
		for i := range b.N {
			s := "s" + string(rune('1'+i%9))
			exec(`SELECT count(*) FROM (SELECT attempt_id, step, provider, state FROM attempts WHERE execution_id = $1 ORDER BY step) x`, "e4242")
			exec(`SELECT count(*) FROM (SELECT call_id, attempt_id, tool, class, state FROM tool_calls
				WHERE session_id = $1 AND state IN ('requested', 'started') ORDER BY requested_at, call_id) x`, s)
		}
	}
	failedTurn := func(b *testing.B) {
		for i := range b.N {
			s := "s" + string(rune('1'+i%9))
			exec(`UPDATE tool_calls SET state = 'interrupted', output = $2, is_error = true, finished_at = now()
				WHERE session_id = $1 AND state = 'requested'`, s, "interrupted: x")
		}
	}
	b.Run("Indexed/RecoveryEvidence", evidence)
	b.Run("Indexed/FailedTurnUpdate", failedTurn)
	exec(`DROP INDEX tool_calls_session`)
	exec(`DROP INDEX attempts_execution`)
	b.Run("Scanned/RecoveryEvidence", evidence)
	b.Run("Scanned/FailedTurnUpdate", failedTurn)
}
