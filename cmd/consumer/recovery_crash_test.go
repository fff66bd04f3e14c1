package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// Recovery (issue "recovery") on real processes: a consumer is killed at a
// crash point, a restarted one (leases of 1s, a pass every 300ms) takes the
// expired claim over, and each test asserts the exact outcome of the one
// decision the phase calls for (docs/design.md, "Crash windows").

// stepAfterSettle is the crash point of the `continue` window: the last
// tool result of a step settled (phase continue committed), the next
// provider step not begun. It was proposed with this test (no point of
// internal/faults lay in that window); the test names it by its string so
// that it compiles, and fails fast, while the point is missing.
const stepAfterSettle = "step.after-settle"

// recoveryFlags start a consumer whose recovery runs often and whose
// claims expire fast.
var recoveryFlags = []string{"--lease", "1s", "--recovery-interval", "300ms"}

// claimOf reads a session's claim: execution, token and phase.
func claimOf(t *testing.T, b *testBundle, session string) (executionID string, token int64, phase string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT execution_id, fencing_token, phase FROM claims WHERE session_id = $1`,
		session).Scan(&executionID, &token, &phase))
	return executionID, token, phase
}

// countLogs counts the JSON log lines of p whose msg is msg and whose
// session_id is session.
func countLogs(p *proc, msg, session string) int {
	n := 0
	for l := range strings.Lines(p.stderr.String()) {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg && line["session_id"] == session {
			n++
		}
	}
	return n
}

// recoveryDecidedIDs returns the recovery.decided events of session on
// Kafka, duplicates included.
func recoveryDecidedIDs(t *testing.T, r *topicReader, session string) []envelope.Event {
	t.Helper()
	var out []envelope.Event
	for _, e := range r.events(t) {
		if e.Type == envelope.EventRecoveryDecided && e.SessionID == session {
			out = append(out, e)
		}
	}
	return out
}

// TestRecoveryAfterClaimAcquire: killed right after a claim committed
// alone (phase ready), before anything was promoted. A plain prompt's claim
// commits with its first turn, so the window is reached with an input
// that takes the other path: a permission reply resuming a parked turn.
// Recovery re-wakes the session and the reply is acted on once.
//
// It catches: a ready claim left to block the session forever (no wake), a
// reply acted on twice (the tool run twice) or never, and a decision other
// than rewoken for a claim with nothing uncertain.
func TestRecoveryAfterClaimAcquire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-acquire"
	ask := []string{"--tool-permission", "echo=ask"}
	p := prompt(session, `/tool echo {"text":"acquired"}`)

	parking := b.start(t, "consumer-0", "", ask...)
	b.send(t, p)
	requestID := b.events.waitAsked(t, session).RequestID
	require.True(t, parking.stop(t).Success())
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session), "parked: no claim")

	crashing := b.start(t, "consumer-1", faults.ClaimAfterAcquire, append(ask, "--lease", "1s")...)
	sendReply(t, b, session, replyJSON(t, envelope.PermissionReply{RequestID: requestID, Reply: envelope.ReplyOnce}))
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	_, _, phase := claimOf(t, b, session)
	require.Equal(t, "ready", phase)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND promotion_seq IS NULL`, session),
		"the reply was not promoted before the crash")

	b.start(t, "consumer-2", "", append(ask, recoveryFlags...)...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: echo: acquired", turn.Text)

	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnCompleted), "one turn.completed")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, session), "one call row")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND call_id = $2 AND state = 'succeeded'`,
		session, requestID), "the approved call ran, once")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'rewoken' AND phase_found = 'ready'`, session))
}

// TestCrashBeforeClaimAsRead: killed after the executor read the session
// and before the claim, taken with the first turn, committed. Nothing of
// the execution is durable, so no recovery is needed: the wake, still in
// the outbox or on Kafka with its offset not committed, reaches the
// restarted consumer and the prompt runs once.
//
// It catches: anything written before that commit (a claim, a promotion or
// an intent left behind would block the session until recovery, or run the
// prompt twice), and a wake whose offset was committed before its run.
func TestCrashBeforeClaimAsRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-as-read"
	p := prompt(session, "as read")

	crashing := b.start(t, "consumer-1", faults.ClaimAsRead)
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session), "no claim")
	require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session), "no intent")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NULL`, p.MessageID))

	// No recovery pass: the redelivered wake alone must bring the prompt.
	b.start(t, "consumer-2", "", "--recovery-interval", "1h")
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "echo: as read", turn.Text)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session), "one provider attempt")
	require.Equal(t, 1, b.count(t, assistantAnswering, p.MessageID), "one assistant message")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session))
}

// TestRecoveryRetriesIdempotentTool: killed between the intent of an
// idempotent call (echo) and its dispatch. Recovery re-arms the call, which
// runs again under the same call ID and idempotency key in exactly one
// continuation, and the turn completes.
//
// It catches: an idempotent call reconciled (turn failed) instead of
// retried, a retry as a new call (new ID or key), a second continuation,
// and a continuation that does not pick the call up (turn never ends).
func TestRecoveryRetriesIdempotentTool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-idem-tool"
	p := prompt(session, `/tool echo {"text":"x"}`)

	crashing := b.start(t, "consumer-1", faults.IdempotentToolAfterIntent, "--lease", "1s")
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	execID, _, phase := claimOf(t, b, session)
	require.Equal(t, "unknown", phase)
	var callID, key string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT call_id, idempotency_key FROM tool_calls
		WHERE session_id = $1 AND tool = 'echo' AND class = 'idempotent' AND state = 'started'`, session).Scan(&callID, &key),
		"the call's intent was committed before the crash")

	b.start(t, "consumer-2", "", recoveryFlags...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: echo: x", turn.Text)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, session), "no second call row")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls
		WHERE session_id = $1 AND call_id = $2 AND idempotency_key = $3 AND state = 'succeeded' AND output = 'x'`, session, callID, key),
		"the same call, with the same key, succeeded")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1 AND decision = 'continued'
		AND rule = 'idempotent_tool_retry' AND continuation_message_id = $2 AND settled_at IS NOT NULL`, execID, recovery.ContinuationID(execID)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND message_id LIKE 'recovery-continue-%'`, session),
		"exactly one continuation")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND promotion_seq IS NOT NULL`, recovery.ContinuationID(execID)))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnCompleted))
	require.Zero(t, testkit.CountEvents(t, b.pool, session, envelope.EventTurnFailed))
}

// TestRecoveryContinuesAfterSettledStep: killed after the last tool result
// of a step settled with phase continue, before the next provider step.
// Recovery admits exactly one continuation, which asks the model again
// without running the side-effecting call a second time.
//
// None of the original crash points lies in this window: after the last
// SettleCall commits (phase continue), the next commit is the step's
// attempt intent (phase unknown), and provider.after-intent fires only
// after it. This test uses the point step.after-settle (right after the
// settling commit whose SettleCall returned last = true, in
// executor/tool_call.go settleCall) and fails when it does not exist.
//
// It catches: a continue claim that is cleared or re-woken (the turn never
// ends), a second continuation, and a continuation that runs the settled
// call again.
func TestRecoveryContinuesAfterSettledStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-continue"
	sandbox := t.TempDir()
	p := prompt(session, `/tool append_line {"file":"log.txt","line":"once"}`)

	crashing := b.start(t, "consumer-1", stepAfterSettle, "--lease", "1s", "--sandbox-dir", sandbox)
	b.send(t, p)
	require.Eventually(t, func() bool {
		return !crashing.running() || len(b.events.turnEvents(t, p.MessageID)) > 0
	}, crashTimeout, 20*time.Millisecond, "neither a crash nor a turn")
	require.False(t, crashing.running(),
		"the turn ended and the consumer still runs: the crash point %q was never reached (it does not exist yet: add faults.Hit(%q) after the commit that settles a step's last tool call, phase continue, in executor/tool_call.go)",
		stepAfterSettle, stepAfterSettle)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	execID, _, phase := claimOf(t, b, session)
	require.Equal(t, "continue", phase)
	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, "log.txt"), "the call ran before the crash")

	b.start(t, "consumer-2", "", append([]string{"--sandbox-dir", sandbox}, recoveryFlags...)...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: append_line: appended", turn.Text)

	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, "log.txt"), "the settled call is not run again")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'succeeded'`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1 AND phase_found = 'continue'
		AND decision = 'continued' AND rule IS NULL AND continuation_message_id = $2`, execID, recovery.ContinuationID(execID)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND message_id LIKE 'recovery-continue-%'`, session),
		"exactly one continuation")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnCompleted))
}

// TestCrashDuringRecovery: consumer A dies with a provider intent committed;
// consumer B dies in its recovery pass, after the takeover and before the
// decision committed; consumer C finishes the recovery exactly once.
//
// It catches: a takeover committed apart from its decision (B's crash would
// leave the claim taken over by nobody, or a decision half-written), and a
// recovery done twice (two turn.failed or recovery.decided writes).
func TestCrashDuringRecovery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-during"
	p := prompt(session, "uncertain")

	a := b.start(t, "consumer-a", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, p)
	requireKilled(t, a.waitExit(t, crashTimeout))
	execID, token, phase := claimOf(t, b, session)
	require.Equal(t, "unknown", phase)

	// B joins a group of its own: only its recovery matters here, and a
	// member that dies while joining A's group would hold C's join (and so
	// C's SIGTERM at cleanup) until its session times out.
	recovering := b.start(t, "consumer-b", faults.RecoveryAfterTakeover,
		append([]string{"--group", b.group + "-b"}, recoveryFlags...)...)
	requireKilled(t, recovering.waitExit(t, crashTimeout))
	// The takeover rolled back with the process: the claim is A's, as it was.
	gotExec, gotToken, gotPhase := claimOf(t, b, session)
	require.Equal(t, []any{execID, token, "unknown"}, []any{gotExec, gotToken, gotPhase}, "the claim is as A left it")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session), "nothing of B's decision committed")
	require.Zero(t, testkit.CountEvents(t, b.pool, session, envelope.EventRecoveryDecided))

	b.start(t, "consumer-c", "", recoveryFlags...)
	failed := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Eventually(t, func() bool { return len(recoveryDecidedIDs(t, b.events, session)) > 0 },
		10*time.Second, 20*time.Millisecond, "recovery.decided published")

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session), "one recovery")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1 AND decision = 'reconciled'
		AND token_before = $2 AND token_after > $2`, execID, token))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnFailed), "one turn.failed")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventRecoveryDecided), "one recovery.decided")
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'unknown'`, session))
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session), "the claim is cleared")
}

// TestConcurrentRecoveryDecidesOnce: two consumers start recovering at the
// same moment, both every 300ms, the expired claim of a third that died
// with a provider intent committed. Exactly one of them decides.
//
// It catches a takeover that is not a compare-and-swap (both decide: two
// decision logs, two recovery.decided or turn.failed writes, or a
// duplicate-key failure that quarantines the claim).
func TestConcurrentRecoveryDecidesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-concurrent"
	p := prompt(session, "uncertain")

	a := b.start(t, "consumer-a", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, p)
	requireKilled(t, a.waitExit(t, crashTimeout))
	execID, _, _ := claimOf(t, b, session)

	r1 := b.start(t, "consumer-b", "", recoveryFlags...)
	r2 := b.start(t, "consumer-c", "", recoveryFlags...)
	failed := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Eventually(t, func() bool { return len(recoveryDecidedIDs(t, b.events, session)) > 0 },
		10*time.Second, 20*time.Millisecond, "recovery.decided published")

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session), "one decision")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1 AND decision = 'reconciled'`, execID))
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventRecoveryDecided), "one recovery.decided written")
	require.Equal(t, 1, distinctIDs(recoveryDecidedIDs(t, b.events, session)), "one recovery.decided event id")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnFailed), "one turn.failed written")
	// The decider logs after its commit, which the relay may publish
	// first: wait for the line, then require that it is the only one.
	decided := func() int {
		return countLogs(r1, "recovery decided", session) + countLogs(r2, "recovery decided", session)
	}
	require.Eventually(t, func() bool { return decided() >= 1 }, 10*time.Second, 20*time.Millisecond, "one of the two logged its decision")
	require.Equal(t, 1, decided(), "one of the two decided")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session), "the claim is cleared, not quarantined")
}

// TestRecoveryOperatorCommands runs the operator subcommands as processes
// on a database left by a crash: `consumer recover` (one pass),
// `consumer recovery plan`, `consumer recovery explain`, `consumer quarantine list` and
// `consumer quarantine release`.
//
// It catches: an explanation that does not name the decision, a poison
// claim (unknown phase) that recovery neither quarantines nor skips, a
// quarantined row missing from the list, a release that does not lift
// the quarantine or leaves no audit row, and a release of an unrepaired
// claim that goes through (it would be quarantined again, in silence).
func TestRecoveryOperatorCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session, bogus = "s-rec-cli", "s-rec-cli-bogus"
	p := prompt(session, "uncertain")

	a := b.start(t, "consumer-a", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, p)
	requireKilled(t, a.waitExit(t, crashTimeout))
	// A claim no recovery can decide on, already expired.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, bogus)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ($1, 'e-bogus', 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, bogus)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND expires_at <= now()`, session) == 1
	}, 10*time.Second, 20*time.Millisecond, "A's claim expires")

	db := []string{"--database-url", b.dbURL}
	// The plan names the decisions the pass then takes, and writes nothing.
	out, stderr, code := runOnce(t, append([]string{"recovery", "plan", "--json"}, db...)...)
	require.Zero(t, code, "consumer recovery plan: %s", stderr)
	var plan recovery.Plan
	require.NoError(t, json.Unmarshal([]byte(out), &plan), out)
	planned := map[string]recovery.DecisionKind{}
	for _, c := range plan.Claims {
		planned[c.SessionID] = c.Decision.Decision
	}
	require.Equal(t, map[string]recovery.DecisionKind{session: recovery.DecisionReconciled, bogus: recovery.DecisionQuarantined}, planned, out)
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries`), "the plan wrote a decision")
	out, stderr, code = runOnce(t, append([]string{"recovery", "plan", "--session", session}, db...)...)
	require.Zero(t, code, "consumer recovery plan: %s", stderr)
	require.Contains(t, out, "Would decide: reconciled")
	require.NotContains(t, out, bogus)

	out, stderr, code = runOnce(t, append([]string{"recover", "--json"}, db...)...)
	require.Zero(t, code, "consumer recover: %s", stderr)
	var pass recovery.Pass
	require.NoError(t, json.Unmarshal([]byte(out), &pass), out)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1, recovery.DecisionQuarantined: 1}, pass.Decisions, out)

	out, stderr, code = runOnce(t, append([]string{"recovery", "explain", session}, db...)...)
	require.Zero(t, code, "consumer recovery explain: %s", stderr)
	require.Contains(t, out, "Decision: reconciled")
	require.Contains(t, out, `in phase "unknown"`)
	require.Contains(t, out, "outcome_unknown")

	out, stderr, code = runOnce(t, append([]string{"recovery", "explain", bogus}, db...)...)
	require.Zero(t, code, "consumer recovery explain: %s", stderr)
	require.Contains(t, out, "Decision: quarantined")

	out, stderr, code = runOnce(t, append([]string{"quarantine", "list"}, db...)...)
	require.Zero(t, code, "consumer quarantine list: %s", stderr)
	var listed string
	for l := range strings.Lines(out) {
		if strings.Contains(l, bogus) {
			listed = l
		}
	}
	require.NotEmpty(t, listed, "the quarantined claim is listed:\n%s", out)
	require.True(t, strings.HasPrefix(listed, "claim "), listed)
	require.Contains(t, listed, `unknown phase "bogus"`)
	require.NotContains(t, out, session+" ", "A's claim was decided, not quarantined")

	// Unrepaired, the release is refused and says why (it would only be
	// quarantined again by the next pass).
	_, stderr, code = runOnce(t, append([]string{"quarantine", "release", "claim", bogus, "--operator", "test"}, db...)...)
	require.Equal(t, 1, code, "an unrepaired release must fail")
	require.Contains(t, stderr, `still fails validation: unknown phase "bogus"`)
	require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE ref = $1`, bogus), "nothing was released")
	// Repaired as the runbook says (the turn is complete: phase safe).
	_, err = b.pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id = $1`, bogus)
	require.NoError(t, err)
	out, stderr, code = runOnce(t, append([]string{"quarantine", "release", "claim", bogus, "--operator", "test"}, db...)...)
	require.Zero(t, code, "consumer quarantine release: %s", stderr)
	require.Contains(t, out, "released claim "+bogus)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases
		WHERE kind = 'claim' AND ref = $1 AND released_by = 'test' AND reason = 'unknown phase "bogus"'`, bogus), "the release is audited")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason IS NULL`, bogus))

	out, _, code = runOnce(t, append([]string{"quarantine", "list"}, db...)...)
	require.Zero(t, code)
	require.NotContains(t, out, bogus, "a released row is no longer listed")
}

// TestRecoveryHoldAndResume: a consumer whose fleet is held
// (`consumer recovery hold`) takes nothing over however many passes it
// runs, and shows what waits in promptline_recovery_held; `recovery
// apply --decision` applies the asked decision only, and `recovery resume`
// returns the running consumer to automatic recovery within its next pass.
//
// It catches: a held pass that takes a claim over or wakes a session, a
// gauge that does not count what waits, an apply that applies other
// decisions, and a mode that a running process does not reread.
func TestRecoveryHoldAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const unknown, ready = "s-hold-unknown", "s-hold-ready"
	pu := prompt(unknown, "uncertain")

	a := b.start(t, "consumer-a", faults.ProviderAfterIntent, "--lease", "1s")
	b.send(t, pu)
	requireKilled(t, a.waitExit(t, crashTimeout))
	// A second expired claim, in phase ready, with a prompt waiting.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, ready)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ($1, 'e-hold-ready', 'owner-gone', 1, 'ready', now() - interval '1 minute')`, ready)
	require.NoError(t, err)

	db := []string{"--database-url", b.dbURL}
	_, stderr, code := runOnce(t, append([]string{"recovery", "hold", "--operator", "ops", "--note", "bad deploy"}, db...)...)
	require.Zero(t, code, "consumer recovery hold: %s", stderr)

	c := b.start(t, "consumer-b", "", recoveryFlags...)
	base := "http://" + c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
	held := func(decision recovery.DecisionKind) float64 {
		_, exposition := httpGet(t, base+"/metrics")
		v, _ := metricValue(exposition, `promptline_recovery_held{decision="`+string(decision)+`"}`)
		return v
	}
	require.Eventually(t, func() bool { return held(recovery.DecisionReconciled) == 1 && held(recovery.DecisionRewoken) == 1 },
		30*time.Second, 50*time.Millisecond, "the held pass counts what waits")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries`), "a held consumer took a claim over")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM claims WHERE session_id IN ($1, $2)`, unknown, ready))

	out, stderr, code := runOnce(t, append([]string{"recovery", "apply", "--decision", "rewoken", "--rate", "5", "--operator", "ops", "--note", "safe ones first", "--json"}, db...)...)
	require.Zero(t, code, "consumer recovery apply: %s", stderr)
	var applied recovery.Applied
	require.NoError(t, json.Unmarshal([]byte(out), &applied), out)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, applied.Decisions)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND recovered_by LIKE 'apply#%:ops'`, ready))
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, unknown), "apply --decision rewoken applied another decision")
	require.Eventually(t, func() bool { return held(recovery.DecisionRewoken) == 0 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 1.0, held(recovery.DecisionReconciled))

	_, stderr, code = runOnce(t, append([]string{"recovery", "resume", "--operator", "ops", "--note", "all clear"}, db...)...)
	require.Zero(t, code, "consumer recovery resume: %s", stderr)
	failed := b.events.waitTurn(t, pu.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'reconciled'`, unknown))
	require.Eventually(t, func() bool { return held(recovery.DecisionReconciled) == 0 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM recovery_actions WHERE operator = 'ops'`), "hold, apply and resume are audited")
}
