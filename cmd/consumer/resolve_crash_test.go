package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// waitCompleted waits for the turn.completed event answering msgID (a
// turn that failed first may complete once an operator resolved it).
func (r *topicReader) waitCompleted(t *testing.T, msgID string) envelope.Event {
	t.Helper()
	var found envelope.Event
	require.Eventually(t, func() bool {
		for _, e := range r.turnEvents(t, msgID) {
			if e.Type == envelope.EventTurnCompleted {
				found = e
				return true
			}
		}
		return false
	}, 40*time.Second, 20*time.Millisecond, "no turn.completed for %s", msgID)
	return found
}

// TestResolveAfterCrashedToolIntent: consumers are SIGKILLed between the
// intent of a side-effecting call (append_line) and its dispatch, in three
// sessions; recovery reconciles each (the call unknown, the turn failed
// outcome_unknown). Then an operator tells promptline what they found,
// with `consumer session resolve`, against the running consumer:
//
//   - --did-not-run: the turn goes on and runs the call, once: one line in
//     the file; resolving again does nothing more, and a later prompt of
//     the session does not run it either;
//   - --ran --output: the turn goes on with that output and runs nothing:
//     no line in the file;
//   - a call whose turn a newer turn superseded: refused, with a message
//     that says so; nothing recorded, nothing run.
//
// `recovery explain` shows the resolution and who made it.
//
// It catches: a resolution that does not continue the turn, runs a call
// that ran, runs a call twice (a second resolve, a later turn), continues
// a superseded turn, or is missing from recovery explain.
func TestResolveAfterCrashedToolIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sandbox := t.TempDir()
	db := []string{"--database-url", b.dbURL}
	sessions := []string{"s-resolve-not-run", "s-resolve-ran", "s-resolve-superseded"}
	first := map[string]envelope.Prompt{}
	for _, s := range sessions {
		first[s] = prompt(s, fmt.Sprintf(`/tool append_line {"file":%q,"line":"once"}`, s+".txt"))
		crashing := b.start(t, "crash-"+s, faults.ToolAfterIntent, "--lease", "1s", "--sandbox-dir", sandbox)
		b.send(t, first[s])
		requireKilled(t, crashing.waitExit(t, crashTimeout))
	}
	live := b.start(t, "consumer-live", "", append([]string{"--sandbox-dir", sandbox}, recoveryFlags...)...)
	calls := map[string]string{}
	for _, s := range sessions {
		failed := b.events.waitTurn(t, first[s].MessageID)
		require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
		require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
		calls[s] = scalar(t, b, `SELECT call_id FROM tool_calls WHERE session_id = $1 AND state = 'unknown'`, s)
		require.Empty(t, sandboxLines(t, sandbox, s+".txt"), "the crash came before the dispatch")
	}

	// Superseded: a newer turn ran; the finding can no longer continue
	// the old one.
	s := "s-resolve-superseded"
	later := prompt(s, "later")
	b.send(t, later)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, later.MessageID).Type)
	_, stderr, code := runOnce(t, append([]string{"session", "resolve", s, calls[s], "--did-not-run", "--operator", "ops"}, db...)...)
	require.Equal(t, 1, code, "resolving a superseded turn must fail")
	require.Contains(t, stderr, "superseded by a newer turn")
	require.Contains(t, stderr, "nothing was recorded")
	require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions WHERE session_id = $1`, s))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, calls[s]))

	// Did not run: the continuation runs it, once.
	s = "s-resolve-not-run"
	out, stderr, code := runOnce(t, append([]string{"session", "resolve", s, calls[s], "--did-not-run",
		"--operator", "ops", "--note", "no line in the file"}, db...)...)
	require.Zero(t, code, "consumer session resolve: %s", stderr)
	require.Contains(t, out, "admitted continuation "+recovery.ResolutionContinuationID(calls[s], 1))
	done := b.events.waitCompleted(t, first[s].MessageID)
	require.Equal(t, "tool results: append_line: appended", done.Text)
	requireToolOutcomes(t, b, s, calls[s], ledger.CallUnknown, ledger.CallSucceeded)
	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, s+".txt"), "the call ran once")
	out, stderr, code = runOnce(t, append([]string{"session", "resolve", s, calls[s], "--did-not-run", "--operator", "ops2"}, db...)...)
	require.Zero(t, code, "resolving twice: %s", stderr)
	require.Contains(t, out, "nothing more done")
	_, stderr, code = runOnce(t, append([]string{"session", "resolve", s, calls[s], "--ran", "--operator", "ops2"}, db...)...)
	require.Equal(t, 1, code, "another finding must be refused")
	require.Contains(t, stderr, "resolved before with another finding: did_not_run by ops")
	after := prompt(s, "after")
	b.send(t, after)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, after.MessageID).Type)
	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, s+".txt"), "never run twice")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM resolutions WHERE session_id = $1 AND resolved_by = 'ops'
		AND note = 'no line in the file' AND settled_at IS NOT NULL`, s), "one resolution, audited, its continuation promoted")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND kind = 'continuation'`, s))
	require.Equal(t, 1, distinctIDs(filterType(b.events.turnEvents(t, first[s].MessageID), envelope.EventTurnCompleted)))

	out, stderr, code = runOnce(t, append([]string{"recovery", "explain", s}, db...)...)
	require.Zero(t, code, "consumer recovery explain: %s", stderr)
	require.Contains(t, out, "Decision: reconciled")
	require.Contains(t, out, "Resolved: tool call "+calls[s]+" (was unknown)")
	require.Contains(t, out, `by ops ("no line in the file"): it did not run; the continuation runs it`)
	require.Contains(t, out, "promoted at ")
	out, stderr, code = runOnce(t, append([]string{"session", "show", s}, db...)...)
	require.Zero(t, code, "consumer session show: %s", stderr)
	require.Contains(t, out, "RESOLUTIONS (1)")
	require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(calls[s])+`\s+1\s+tool_call\s+unknown\s+did_not_run\s+ops\s`, out)

	// Ran: the model is handed the output, nothing runs.
	s = "s-resolve-ran"
	out, stderr, code = runOnce(t, append([]string{"session", "resolve", s, calls[s], "--ran", "--output", `{"appended":true}`,
		"--operator", "ops", "--json"}, db...)...)
	require.Zero(t, code, "consumer session resolve: %s", stderr)
	var res recovery.ResolveResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, recovery.FindingRan, res.Resolution.Finding)
	require.False(t, res.Already)
	done = b.events.waitCompleted(t, first[s].MessageID)
	require.Equal(t, `tool results: append_line: {"appended":true}`, done.Text)
	requireToolOutcomes(t, b, s, calls[s], ledger.CallUnknown, ledger.CallSucceeded)
	out, stderr, code = runOnce(t, append([]string{"session", "resolve", s, calls[s], "--ran", "--output", `{"appended":true}`,
		"--operator", "ops"}, db...)...)
	require.Zero(t, code, "resolving twice: %s", stderr)
	require.Contains(t, out, "nothing more done")
	after = prompt(s, "after")
	b.send(t, after)
	require.Equal(t, envelope.EventTurnCompleted, b.events.waitTurn(t, after.MessageID).Type)
	require.Empty(t, sandboxLines(t, sandbox, s+".txt"), "a call that ran is never run by promptline")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, s), "no second call")
	require.True(t, live.running())
}

// requireToolOutcomes waits until the session's tool.completed events of
// call, one per id (as a deduplicating consumer keeps them), say want, in
// order: recovery's outcome after the kill, then the one the operator's
// finding led to. Each outcome the ledger took is announced, under an id
// of its own.
func requireToolOutcomes(t *testing.T, b *testBundle, session, call string, want ...ledger.CallState) {
	t.Helper()
	var got []ledger.CallState
	require.Eventually(t, func() bool {
		got = nil
		seen := map[string]bool{}
		for _, e := range b.events.events(t) {
			if e.SessionID == session && e.Type == envelope.EventToolCompleted && e.CallID == call && !seen[e.ID] {
				seen[e.ID] = true
				got = append(got, ledger.CallState(e.Outcome))
			}
		}
		return slices.Equal(got, want)
	}, 20*time.Second, 20*time.Millisecond, "tool.completed outcomes of %s", call)
	require.Equal(t, want, got)
}

func filterType(evs []envelope.Event, typ string) []envelope.Event {
	var out []envelope.Event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// TestResolveFlags: the command's own checks, before it touches anything.
func TestResolveFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"NoFinding", []string{"s", "c"}, "exactly one of --ran and --did-not-run"},
		{"BothFindings", []string{"s", "c", "--ran", "--did-not-run"}, "exactly one of --ran and --did-not-run"},
		{"OutputWithoutRan", []string{"s", "c", "--did-not-run", "--output", "{}"}, "--output: goes only with --ran"},
		{"OutputNotJSON", []string{"s", "c", "--ran", "--output", "appended"}, "--output: not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"session", "resolve"}, tc.args...)
			_, stderr, code := runOnce(t, append(args, "--operator", "ops", "--database-url", "postgres://127.0.0.1:1/none")...)
			require.Equal(t, 1, code)
			require.Contains(t, stderr, tc.want)
		})
	}
}

// TestResolvedCallKilledAgain: the continuation of a --did-not-run
// resolution is itself SIGKILLed between the re-armed call's intent and
// its dispatch. The call is then unknown again (never re-run by recovery:
// P4 holds for a resolved call as for any), the first command repeated is
// refused (it vouched for round 1's run only), and a second resolution
// naming round 2, with its own continuation, runs it once.
//
// It catches: a recovery that replays the re-armed call, a repeated
// command that vouches for a run it was not about, a resolution
// that cannot be made again once its continuation died (a dead end again),
// and a call run twice across the two rounds.
func TestResolvedCallKilledAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-resolve-again"
	sandbox := t.TempDir()
	db := []string{"--database-url", b.dbURL}
	first := prompt(session, `/tool append_line {"file":"log.txt","line":"once"}`)

	crashing := b.start(t, "crash-1", faults.ToolAfterIntent, "--lease", "1s", "--sandbox-dir", sandbox)
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	// The next consumer reconciles the call, then dies at the same point
	// when the resolution's continuation runs it.
	crashing = b.start(t, "crash-2", faults.ToolAfterIntent, append([]string{"--sandbox-dir", sandbox}, recoveryFlags...)...)
	failed := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	call := scalar(t, b, `SELECT call_id FROM tool_calls WHERE session_id = $1 AND state = 'unknown'`, session)
	_, stderr, code := runOnce(t, append([]string{"session", "resolve", session, call, "--did-not-run", "--operator", "ops"}, db...)...)
	require.Zero(t, code, "consumer session resolve: %s", stderr)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Empty(t, sandboxLines(t, sandbox, "log.txt"), "the crash came before the dispatch")

	b.start(t, "consumer-live", "", append([]string{"--sandbox-dir", sandbox}, recoveryFlags...)...)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, session) == 0 &&
			b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, call) == 1
	}, 40*time.Second, 50*time.Millisecond, "recovery reconciles the continuation: the call is unknown again")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'reconciled'`, session))
	require.Empty(t, sandboxLines(t, sandbox, "log.txt"), "recovery never re-runs the re-armed call")

	// The first command again is about round 1's run, not this one:
	// refused, with the round to name once the new run was checked.
	_, stderr, code = runOnce(t, append([]string{"session", "resolve", session, call, "--did-not-run", "--operator", "ops"}, db...)...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--round 2")
	out, stderr, code := runOnce(t, append([]string{"session", "resolve", session, call, "--did-not-run", "--round", "2", "--operator", "ops"}, db...)...)
	require.Zero(t, code, "consumer session resolve: %s", stderr)
	require.Contains(t, out, "admitted continuation "+recovery.ResolutionContinuationID(call, 2))
	done := b.events.waitCompleted(t, first.MessageID)
	require.Equal(t, "tool results: append_line: appended", done.Text)
	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, "log.txt"), "run once across both rounds")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM resolutions WHERE target_id = $1 AND settled_at IS NOT NULL`, call))
}
