package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/recovery"
)

// TestMassCrashHeldThenApplied: three consumers of one group, each with
// turns in flight (a slow scripted provider), are killed with SIGKILL at
// once; the fleet is held (`consumer recovery hold`) before a fresh
// consumer starts. Its passes take nothing over (no claim changes hands
// over several passes), `recovery plan --json` lists every expired claim
// with its decision, `recovery apply --rate` applies part of them at the
// rate (measured from the recoveries' own timestamps), and `recovery
// resume` hands the rest to the running consumer's next pass. Every
// prompt ends in exactly one terminal event and every execution is
// recovered once.
//
// It catches: a held pass or a wake that takes a claim over, a plan that
// misses claims beyond a batch, an apply faster than its rate or that
// applies a claim twice, and a resume a running consumer does not follow.
func TestMassCrashHeldThenApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	consumers := make([]*proc, 3)
	for i := range consumers {
		consumers[i] = b.start(t, fmt.Sprintf("consumer-%d", i+1), "", "--lease", "1s", "--recovery-interval", "300ms")
	}
	requireSharing(t, consumers)

	// One slow turn per session, in flight when the fleet dies (phase
	// unknown: reconciled, never replayed); a third of the sessions have
	// a prompt queued behind it, which the reconciling decision wakes.
	const sessions = 18
	var slow, queued []envelope.Prompt
	for s := range sessions {
		p := prompt(fmt.Sprintf("s-mass-%02d", s), "/sleep 5m")
		slow = append(slow, p)
		b.send(t, p)
	}
	inFlight := `SELECT count(*) FROM claims c JOIN attempts a ON a.execution_id = c.execution_id
		WHERE c.session_id LIKE 's-mass-%' AND c.phase = 'unknown' AND a.state = 'started'`
	require.Eventually(t, func() bool { return b.count(t, inFlight) == sessions }, 60*time.Second, 50*time.Millisecond,
		"every session's slow turn in flight")
	// Sent once the slow turns run, so that no turn answers both.
	for s := 0; s < sessions; s += 3 {
		q := prompt(slow[s].SessionID, "queued behind the slow turn")
		queued = append(queued, q)
		b.send(t, q)
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM inputs WHERE message_id = ANY($1) AND promotion_seq IS NULL`, messageIDs(queued)) == len(queued)
	}, 30*time.Second, 50*time.Millisecond, "the queued prompts admitted, waiting")
	require.Equal(t, 3, b.count(t, `SELECT count(DISTINCT owner_id) FROM claims WHERE session_id LIKE 's-mass-%'`),
		"each of the three consumers runs turns when the fleet dies")
	for _, c := range consumers {
		require.NoError(t, c.cmd.Process.Kill())
	}
	for _, c := range consumers {
		requireKilled(t, c.waitExit(t, 10*time.Second))
	}

	db := []string{"--database-url", b.dbURL}
	_, stderr, code := runOnce(t, append([]string{"recovery", "hold", "--operator", "ops", "--note", "fleet lost"}, db...)...)
	require.Zero(t, code, "consumer recovery hold: %s", stderr)
	type claimRow struct {
		Session, Execution, Owner string
		Token                     int64
	}
	readClaims := func() []claimRow {
		rows, err := b.pool.Query(t.Context(), `SELECT session_id, execution_id, owner_id, fencing_token FROM claims
			WHERE session_id LIKE 's-mass-%' ORDER BY session_id`)
		require.NoError(t, err)
		defer rows.Close()
		var out []claimRow
		for rows.Next() {
			var r claimRow
			require.NoError(t, rows.Scan(&r.Session, &r.Execution, &r.Owner, &r.Token))
			out = append(out, r)
		}
		require.NoError(t, rows.Err())
		return out
	}
	before := readClaims()
	require.Len(t, before, sessions)

	// A batch smaller than what waits: the held gauge counts past it.
	c := b.start(t, "consumer-4", "", "--lease", "1s", "--recovery-interval", "300ms", "--recovery-batch", "5")
	base := "http://" + c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
	held := func(decision recovery.DecisionKind) float64 {
		_, exposition := httpGet(t, base+"/metrics")
		v, _ := metricValue(exposition, `promptline_recovery_held{decision="`+string(decision)+`"}`)
		return v
	}
	require.Eventually(t, func() bool { return held(recovery.DecisionReconciled) == sessions }, 30*time.Second, 50*time.Millisecond,
		"the held gauge counts every expired claim")
	passes := func() int { return countMsg(c, "recovery pass held") }
	seen := passes()
	require.Eventually(t, func() bool { return passes() >= seen+5 }, 30*time.Second, 50*time.Millisecond, "five more held passes")
	require.Equal(t, before, readClaims(), "a held consumer took a claim over")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id LIKE 's-mass-%'`))

	// The plan lists every expired claim, with its decision.
	out, stderr, code := runOnce(t, append([]string{"recovery", "plan", "--all", "--json", "--recovery-batch", "5"}, db...)...)
	require.Zero(t, code, "consumer recovery plan: %s", stderr)
	var plan recovery.Plan
	require.NoError(t, json.Unmarshal([]byte(out), &plan), out)
	planned := map[string]recovery.DecisionKind{}
	for _, pc := range plan.Claims {
		planned[pc.ExecutionID] = pc.Decision.Decision
	}
	require.Len(t, plan.Claims, sessions)
	for _, r := range before {
		require.Equal(t, recovery.DecisionReconciled, planned[r.Execution], "the plan's decision for %s (%s)", r.Session, r.Execution)
	}
	require.Empty(t, plan.LostWakes, "a queued prompt behind a claim is no lost wake")

	// Part of them at a bounded rate, audited as the operator's run.
	const rate, applied = 4.0, 10
	out, stderr, code = runOnce(t, append([]string{"recovery", "apply", "--rate", fmt.Sprint(rate), "--max", fmt.Sprint(applied),
		"--recovery-batch", "5", "--operator", "ops", "--note", "a few first", "--json"}, db...)...)
	require.Zero(t, code, "consumer recovery apply: %s", stderr)
	var res recovery.Applied
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: applied}, res.Decisions)
	require.Equal(t, applied, strings.Count(stderr, "applied "), "a line per item without a terminal: %s", stderr)
	var span float64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT extract(epoch FROM max(decided_at) - min(decided_at))::float8 FROM recoveries
		WHERE session_id LIKE 's-mass-%' AND recovered_by = $1`, fmt.Sprintf("apply#%d:ops", res.ID)).Scan(&span))
	require.GreaterOrEqual(t, span, float64(applied-1)/rate*0.9, "%d decisions at %g/s", applied, rate)
	require.Equal(t, applied, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id LIKE 's-mass-%'`))

	// Resume: the running consumer's next pass recovers the rest.
	_, stderr, code = runOnce(t, append([]string{"recovery", "resume", "--operator", "ops", "--note", "all clear"}, db...)...)
	require.Zero(t, code, "consumer recovery resume: %s", stderr)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM recoveries WHERE session_id LIKE 's-mass-%'`) == sessions
	}, 30*time.Second, 50*time.Millisecond, "automatic recovery after resume")
	var lag float64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT extract(epoch FROM max(r.decided_at) - (SELECT max(at) FROM recovery_actions WHERE action = 'resume'))::float8
		FROM recoveries r WHERE r.session_id LIKE 's-mass-%' AND r.recovered_by NOT LIKE 'apply#%'`).Scan(&lag))
	// One pass (300ms interval) and its decisions; the bound leaves room
	// for a loaded machine, not for a second pass-interval of seconds.
	require.Less(t, lag, 3.0, "the rest was recovered by the consumer's pass within one pass of the resume")
	require.Equal(t, sessions-applied, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id LIKE 's-mass-%' AND recovered_by NOT LIKE 'apply#%'`))

	// Each exactly once.
	for _, p := range slow {
		failed := b.events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
		require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	}
	for _, q := range queued {
		done := b.events.waitTurn(t, q.MessageID)
		require.Equal(t, envelope.EventTurnCompleted, done.Type, "%+v", done)
	}
	for _, p := range append(slow, queued...) {
		require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "one terminal event for %s", p.MessageID)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, p.MessageID))
	}
	for _, r := range before {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1`, r.Execution), "recovered once: %s", r.Execution)
	}
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM recovery_actions WHERE operator = 'ops'`), "hold, apply and resume are audited")
}

// requireSharing waits until the consumers share the prompts partitions:
// each one's latest assignment, of one generation, holds some.
func requireSharing(t *testing.T, consumers []*proc) {
	t.Helper()
	require.Eventually(t, func() bool {
		gens := map[float64]bool{}
		for _, c := range consumers {
			line := lastLog(c.stderr.String(), "partitions assigned")
			if line == nil {
				return false
			}
			claims, _ := line["claims"].(map[string]any)
			if parts, _ := claims["prompts"].([]any); len(parts) == 0 {
				return false
			}
			gen, _ := line["generation"].(float64)
			gens[gen] = true
		}
		return len(gens) == 1
	}, 60*time.Second, 50*time.Millisecond, "the consumers sharing the partitions")
}

// countMsg counts the JSON log lines of p whose msg is msg.
func countMsg(p *proc, msg string) int {
	n := 0
	for l := range strings.Lines(p.stderr.String()) {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
			n++
		}
	}
	return n
}

func messageIDs(ps []envelope.Prompt) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.MessageID
	}
	return out
}
