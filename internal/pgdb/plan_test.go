package pgdb_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// The executor's per-session statements must reach one session's rows
// through a per-session index whatever the planner knows. On tables without
// statistics (a new database, or before autovacuum analyses) the planner
// used to scan the cross-session partial indexes instead, so every turn
// cost O(waiting inputs + live claims) and a backlog fed itself
// (migration 00007). Plans are checked before and after ANALYZE, generic
// (as prepared statements end up) and custom.
func TestPerSessionStatementsUseSessionIndexes(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	exec := pc.Exec
	for _, table := range []string{"sessions", "inputs", "claims", "messages", "message_parts"} {
		exec(`ALTER TABLE ` + table + ` SET (autovacuum_enabled = false)`)
	}
	statements := []struct {
		name, sql, args string
		want            []string // index names the plan may use
		// seqscanOff: the statement is planned as its function is, with
		// enable_seqscan off (checked below).
		seqscanOff bool
	}{
		// ledger's inputWaitsSQL, the release's look.
		{"a waiting input", `SELECT EXISTS (SELECT 1 FROM waiting_inputs WHERE session_id = $1)`, `('s42')`,
			[]string{"inputs_waiting_session"}, false},
		{"waiting list", `SELECT message_id FROM waiting_inputs WHERE session_id = $1 ORDER BY admission_seq`, `('s42')`,
			[]string{"inputs_waiting_session"}, false},
		// The head a turn is chosen from (executor's waitingSQL and
		// promptline_claim_as_read): its oldest input through the session
		// index, never inputs_admission_seq_key read from the start of
		// the table (TestATurnReadsTheHeadOfADeepQueue reads all three
		// parts).
		{"waiting head", `SELECT message_id FROM promptline_waiting_head($1)`, `('s42')`,
			[]string{"inputs_waiting_session"}, false},
		// The statement inside promptline_fence, as its body has it.
		{"fence", pc.FunctionStatement("promptline_fence", `UPDATE claims SET expires_at = v_now + p_lease_ms * interval '1 millisecond', renewed_at = v_now,
				phase = coalesce(p_phase, phase),
				assistant_message_id = coalesce(nullif(p_assistant, ''), assistant_message_id),
				write_seq = coalesce(p_seq, write_seq)
			WHERE session_id = p_session AND execution_id = p_execution AND fencing_token = p_token
				AND expires_at > v_now AND quarantine_reason IS NULL
				AND (p_seq IS NULL OR write_seq < p_seq)`, map[string]string{
			"p_session": "$1", "p_execution": "$2", "p_token": "$3", "p_lease_ms": "$4",
			"p_phase": "$5::text", "p_assistant": "$6::text", "p_seq": "$7::bigint", "v_now": "clock_timestamp()",
		}),
			`('s42', 'e42', 1, 1000, NULL, '', 7)`, []string{"claims_pkey", "claims_execution_id_key"}, false},
		// The grouped first steps' promotion (promptline_turn_writes_group,
		// migration 00024): the inputs through the primary key, never a
		// scan of inputs.
		{"grouped promotion", pc.FunctionStatement("promptline_turn_writes_group", `WITH s AS (
				SELECT DISTINCT ON (u.id) u.id, u.k, u.n
				FROM unnest(p_inputs, p_inputs_of) WITH ORDINALITY AS u(id, k, n) ORDER BY u.id, u.n
			), q AS (
				SELECT s.id, s.k, nextval('promotion_seq') AS seq FROM s ORDER BY s.n
			), p AS (
				UPDATE inputs SET promotion_seq = q.seq, promoted_at = now()
				FROM q WHERE inputs.message_id = ANY (p_inputs) AND inputs.message_id = q.id AND inputs.promotion_seq IS NULL
				RETURNING inputs.message_id, inputs.session_id, inputs.text, q.k, q.seq
			), m AS (
				INSERT INTO messages (message_id, session_id, role, status, completed_at, execution_id, fencing_token)
				SELECT p.message_id, p.session_id, 'user', 'completed', now(), p_execution[p.k], p_token[p.k] FROM p ORDER BY p.seq
			)
			INSERT INTO message_parts (message_id, idx, kind, body) SELECT p.message_id, 0, 'text', p.text FROM p`, map[string]string{
			"p_inputs": "$1::text[]", "p_inputs_of": "$2::integer[]", "p_execution": "($3::text[])", "p_token": "($4::bigint[])",
		}),
			`(ARRAY['m1', 'm2', 'm3'], ARRAY[1, 1, 2], ARRAY['e1', 'e2'], ARRAY[1, 1]::bigint[])`, []string{"inputs_pkey"}, true},
		// The grouped answers' messages (promptline_turn_answer_writes_group).
		{"grouped answers' messages", pc.FunctionStatement("promptline_turn_answer_writes_group",
			`UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = ANY (p_message) AND status = 'pending'`,
			map[string]string{"p_message": "$1::text[]"}),
			`(ARRAY['u1', 'u2'])`, []string{"messages_pkey"}, true},
		// A copy of transcript's historySQL, read at every promotion: the
		// session's messages through their index (the parts' lookup under
		// skewed statistics is transcript's own test).
		{"transcript", `SELECT m.message_id, p.body FROM messages m
			LEFT JOIN LATERAL (SELECT p.idx, p.body FROM message_parts p WHERE p.message_id = m.message_id OFFSET 0) p ON true
			WHERE m.session_id = $1 AND (m.role IN ('user', 'tool') OR m.status = 'completed') ORDER BY m.seq, p.idx`,
			`('s42')`, []string{"messages_session"}, false},
	}
	for _, fn := range []string{"promptline_turn_writes_group", "promptline_turn_answer_writes_group"} {
		require.Contains(t, pc.FunctionSettings(fn), "enable_seqscan=off", fn)
	}
	// planned runs fn under statement i's settings.
	planned := func(i int, fn func()) {
		t.Helper()
		if statements[i].seqscanOff {
			exec(`SET enable_seqscan = off`)
			defer exec(`RESET enable_seqscan`)
		}
		fn()
	}
	explain := pc.Explain
	check := func(stage, name string, i int, args string) {
		t.Helper()
		s := statements[i]
		var plan string
		planned(i, func() { plan = explain(name, args) })
		for _, idx := range s.want {
			// A grouped statement, planned with sequential scans off,
			// could still walk a whole index: it must look its rows up.
			if testkit.UsesIndex(plan, idx) && (!s.seqscanOff || testkit.LooksUpIndex(plan, idx)) {
				return
			}
		}
		t.Fatalf("%s, %s: the plan must look rows up through one of %v:\n%s", stage, s.name, s.want, plan)
	}

	// A process starts on empty tables: its statements are prepared and
	// their generic plans cached while the tables are empty.
	exec(`SET plan_cache_mode = force_generic_plan`)
	for i, s := range statements {
		exec(fmt.Sprintf(`PREPARE cached%d AS %s`, i, s.sql))
		planned(i, func() { explain(fmt.Sprintf("cached%d", i), s.args) })
	}
	// Then a backlog builds: 20,000 sessions with a waiting input each,
	// 3,000 of them with a live claim.
	exec(`INSERT INTO sessions (session_id) SELECT 's' || g FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, admitted_at)
		SELECT 'm' || g, 's' || g, 'x', '\x00', 'queue', true, now() - interval '1 hour' FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		SELECT 's' || g, 'e' || g, 'o', 1, 'ready', now() + interval '1 minute' FROM generate_series(1, 3000) g`)
	exec(`INSERT INTO messages (message_id, session_id, role, status)
		SELECT 'u' || g, 's' || (g % 20000 + 1), 'user', 'completed' FROM generate_series(1, 40000) g`)
	exec(`INSERT INTO message_parts (message_id, idx, kind, body) SELECT 'u' || g, 0, 'text', 'x' FROM generate_series(1, 40000) g`)

	fresh := func(stage string) {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			exec(`SET plan_cache_mode = ` + mode)
			for i, s := range statements {
				name := fmt.Sprintf("p%d_%s", i, mode)
				exec(`PREPARE ` + name + ` AS ` + s.sql)
				check(stage+", "+mode, name, i, s.args)
				exec(`DEALLOCATE ` + name)
			}
		}
	}
	for i, s := range statements {
		check("plan cached on empty tables", fmt.Sprintf("cached%d", i), i, s.args)
	}
	fresh("without statistics")
	exec(`ANALYZE sessions, inputs, claims, messages, message_parts`)
	fresh("after ANALYZE")
}
