package recovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// sideTool is a side-effecting tool that counts its runs, with the
// idempotency key and fencing token of each.
type sideTool struct {
	mu     sync.Mutex
	keys   []string
	tokens []int64
}

func (s *sideTool) Spec() tools.Spec {
	return tools.Spec{Name: "append_line", Class: tools.SideEffecting, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (s *sideTool) Run(_ context.Context, c tools.Call) (tools.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, c.IdempotencyKey)
	s.tokens = append(s.tokens, c.FencingToken)
	return tools.Result{Output: "appended"}, nil
}

func (s *sideTool) tokensSeen() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.tokens...)
}

func (s *sideTool) runs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// unknownCall leaves a side-effecting call unknown as a crash between its
// intent and its result does, reconciled by a recovery pass, and returns
// the call.
func (b *testBundle) unknownCall(t *testing.T, session string) (*crashed, ledger.CallParams) {
	t.Helper()
	b.admit(t, session, "m1", `/tool append_line {"line":"x"}`)
	c := b.startTurn(t, session, "m1")
	att := b.beginAttempt(t, c, 1, "scripted")
	calls := b.toolStep(t, c, att, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{"line":"x"}`})
	b.startCall(t, c, calls[0])
	b.die(t, session)
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, calls[0].ID))
	return c, calls[0]
}

func (b *testBundle) resolve(t *testing.T, session, target, finding, output string) (recovery.ResolveResult, error) {
	t.Helper()
	return recovery.Resolve(context.Background(), b.pool, session, target, &recovery.ResolveOpts{
		Finding: finding, Output: output, Operator: "alice", Note: "checked the file"})
}

func (b *testBundle) resolveRound(t *testing.T, session, target, finding string, round int) (recovery.ResolveResult, error) {
	t.Helper()
	return recovery.Resolve(context.Background(), b.pool, session, target, &recovery.ResolveOpts{
		Finding: finding, Operator: "alice", Note: "checked the file", Round: round})
}

func (b *testBundle) registry(t *testing.T, tool tools.Tool) *tools.Registry {
	t.Helper()
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tool))
	return reg
}

func (b *testBundle) completed(t *testing.T, session string) []envelope.Event {
	t.Helper()
	return testkit.SessionEvents(t, b.pool, session, envelope.EventTurnCompleted)
}

// TestResolve covers `consumer session resolve` below the command: an
// operator's finding on an unknown call or attempt, the one continuation
// it admits, and every refusal.
//
// It catches: a did-not-run call that is not run, or run twice (also by a
// second resolve); a ran call that runs, or whose output the model does
// not see; a resolution racing a claim holder, continuing a superseded
// turn, or recorded twice by two operators at once; a resolution that
// `recovery explain` does not show.
func TestResolve(t *testing.T) {
	t.Parallel()

	t.Run("DidNotRunRunsTheCallOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		crashed, call := b.unknownCall(t, "s")
		res, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		require.False(t, res.Already)
		require.Equal(t, recovery.ResolutionContinuationID(call.ID, 1), res.Resolution.ContinuationID)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND kind = 'continuation' AND delivery = 'steer' AND promotion_seq IS NULL`,
			res.Resolution.ContinuationID))
		wakes := b.wakes(t, "s")
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Equal(t, []string{call.IdempotencyKey}, tool.runs(), "the call runs once, under its own idempotency key")
		require.Greater(t, tool.tokensSeen()[0], crashed.x.Claim().Token,
			"with a fencing token above the dead execution's, so a target can refuse that one's late call")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'succeeded' AND output = 'appended'`, call.ID))
		done := b.completed(t, "s")
		require.Len(t, done, 1, "the turn goes on and completes")
		require.Equal(t, "tool results: append_line: appended", done[0].Text)
		require.Equal(t, []string{"m1"}, done[0].MessageIDs, "the same turn, answering the same input")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM resolutions WHERE target_id = $1 AND settled_at IS NOT NULL`, call.ID))

		// Again: nothing more.
		again, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		require.True(t, again.Already)
		require.Equal(t, wakes, b.wakes(t, "s"), "no second wake")
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Len(t, tool.runs(), 1, "the call never runs twice")
		require.Len(t, b.completed(t, "s"), 1)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = 's' AND kind = 'continuation'`))
	})

	t.Run("ContinuationRunsBeforeWaitingPrompts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		// A prompt that waits with no claim (its wake still on its way):
		// the next executor must continue the resolved turn first, or the
		// prompt's turn would supersede it.
		b.admit(t, "s", "m2", "later")
		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Len(t, tool.runs(), 1)
		done := b.completed(t, "s")
		require.Len(t, done, 2)
		require.Equal(t, []string{"m1"}, done[0].MessageIDs, "the resolved turn goes on first")
		require.Equal(t, "tool results: append_line: appended", done[0].Text)
		require.Equal(t, []string{"m2"}, done[1].MessageIDs)
		require.Equal(t, "echo: later", done[1].Text)
	})

	t.Run("UnknownAgainIsANewRound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		first, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		// As a continuation killed between the call's intent and its
		// result leaves it, once recovery reconciled it again: promoted,
		// the call unknown, no newer assistant message.
		b.exec(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now() WHERE message_id = $1`, first.Resolution.ContinuationID)
		b.exec(t, `UPDATE resolutions SET settled_at = now() WHERE target_id = $1`, call.ID)
		b.exec(t, `UPDATE tool_calls SET state = 'unknown', output = 'outcome unknown after restart', is_error = true, finished_at = now() WHERE call_id = $1`, call.ID)
		// The same command again is about round 1, which does not vouch
		// for the continuation's run: refused, nothing recorded.
		_, err = b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrUnknownAgain)
		require.ErrorContains(t, err, "--round 2")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM resolutions WHERE target_id = $1`, call.ID))
		_, err = b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 3)
		require.ErrorIs(t, err, recovery.ErrNoRound)
		require.ErrorContains(t, err, "no round 3 to resolve: its latest is round 1 (did_not_run), and it is unknown")
		// Round 1 named again: the finding recorded, a no-op.
		repeat, err := b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 1)
		require.NoError(t, err)
		require.True(t, repeat.Already)
		require.Equal(t, 1, repeat.Resolution.Round)
		second, err := b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 2)
		require.NoError(t, err)
		require.False(t, second.Already)
		require.Equal(t, 2, second.Resolution.Round)
		require.Equal(t, recovery.ResolutionContinuationID(call.ID, 2), second.Resolution.ContinuationID)
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Len(t, tool.runs(), 1)
		require.Len(t, b.completed(t, "s"), 1)
		again, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		require.True(t, again.Already, "the call succeeded: the second round stands")
		require.Equal(t, 2, again.Resolution.Round)
		repeat, err = b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 2)
		require.NoError(t, err)
		require.True(t, repeat.Already)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM resolutions WHERE target_id = $1`, call.ID))
	})

	t.Run("RanHandsTheOutputAndRunsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		res, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{"appended":true}`)
		require.NoError(t, err)
		require.NotEmpty(t, res.Resolution.ContinuationID)
		tool := &sideTool{}
		rec := &recorder{}
		b.run(t, rec, b.registry(t, tool), "s")
		require.Empty(t, tool.runs(), "a call that ran is never run again")
		done := b.completed(t, "s")
		require.Len(t, done, 1)
		require.Equal(t, `tool results: append_line: {"appended":true}`, done[0].Text)
		reqs := rec.all()
		require.Len(t, reqs, 1, "one provider step, with the given output")
		last := reqs[0].Messages[len(reqs[0].Messages)-1]
		require.Equal(t, "tool", last.Role)
		require.Equal(t, `{"appended":true}`, last.Text)
		require.False(t, last.IsError)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'succeeded'`, call.ID))

		again, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{"appended":true}`)
		require.NoError(t, err)
		require.True(t, again.Already)
		_, err = b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrResolvedOtherwise)
		require.Contains(t, err.Error(), "ran by alice")
		b.run(t, rec, b.registry(t, tool), "s")
		require.Empty(t, tool.runs())
		require.Len(t, b.completed(t, "s"), 1)
	})

	t.Run("RefusedWhileClaimed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		c := b.startTurn(t, "s", "m1")
		att := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, att, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{}`})
		b.startCall(t, c, calls[0])
		// Even an unknown call is not the operator's while a claim holds
		// the session: its holder (or recovery) is the one writer.
		b.exec(t, `UPDATE tool_calls SET state = 'unknown' WHERE call_id = $1`, calls[0].ID)
		_, err := b.resolve(t, "s", calls[0].ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrSessionBusy)
		require.Contains(t, err.Error(), "a consumer is running it")
		b.die(t, "s")
		_, err = b.resolve(t, "s", calls[0].ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrSessionBusy)
		require.Contains(t, err.Error(), "recovery has not decided it yet")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'unknown'`), "nothing changed")
	})

	// A turn parked on a permission ask goes on when its reply comes: a
	// continuation admitted meanwhile would continue it a second time
	// (invariant 12). Refused while the ask waits, and once the reply is
	// admitted, while its input waits (the reply continues the turn).
	t.Run("RefusedWhileAPermissionAskWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		b.exec(t, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
			VALUES ('ask-1', 's', $1, 'append_line', 'append_line', 'pending')`, call.ID)
		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrPermissionPending)
		require.Contains(t, err.Error(), "ask-1")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`), "nothing admitted")

		// The reply admitted: the request answered, its input waits.
		admitter := admission.NewAdmitter(b.pool, &admission.AdmitterConfig{})
		out, err := admitter.AdmitReply(context.Background(), []byte("s"),
			envelope.PermissionReply{RequestID: "ask-1", Reply: "once"}, admission.Source{})
		require.NoError(t, err)
		require.Equal(t, admission.Admitted, out.Outcome)
		_, err = b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrContinuationWaits)
		require.Contains(t, err.Error(), admission.ReplyPrefix+"ask-1")
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`), "nothing admitted")
	})

	// A second resolution while the first one's continuation waits is
	// refused (invariant 12), whatever else the session waits for.
	t.Run("RefusedWhileAContinuationWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		first, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		// Another unknown target of the session, as a second call left.
		b.exec(t, `UPDATE attempts SET state = 'unknown' WHERE attempt_id = (SELECT attempt_id FROM tool_calls WHERE call_id = $1)`, call.ID)
		var attempt string
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT attempt_id FROM tool_calls WHERE call_id = $1`, call.ID).Scan(&attempt))
		_, err = b.resolve(t, "s", attempt, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrContinuationWaits)
		require.Contains(t, err.Error(), first.Resolution.ContinuationID)
	})

	t.Run("RefusedWhenSuperseded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		b.admit(t, "s", "m2", "later")
		b.run(t, &recorder{}, b.registry(t, &sideTool{}), "s")
		require.Len(t, b.completed(t, "s"), 1, "a newer turn ran")
		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrSuperseded)
		require.Contains(t, err.Error(), "superseded by a newer turn")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, call.ID))
	})

	t.Run("RefusedWhenTheTurnWentOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		// As a tool that could not say how it went leaves it: the model was
		// told the outcome is unknown, and the turn answered after it.
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, turn_id, completed_at)
			VALUES ('asst-next', 's', 'assistant', 'completed', 'asst-s', now())`)
		_, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{}`)
		require.ErrorIs(t, err, recovery.ErrSuperseded)
		require.ErrorContains(t, err, "the turn went on past it (assistant message asst-next")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
	})

	// Another provider attempt of the call's step is unknown too (the
	// step sent again in the same message): a continuation of this finding
	// would act on that attempt's outcome unvouched, so the operator is told
	// to resolve it first.
	t.Run("RefusedWhenAnotherAttemptIsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, call := b.unknownCall(t, "s")
		b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state)
			SELECT 'att-again', session_id, execution_id, $2, step, provider, 'att-again', fencing_token, request_hash, 'unknown'
			FROM attempts WHERE attempt_id = $1`, call.AttemptID, c.assistant)
		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrLaterUnknown)
		require.ErrorContains(t, err, "attempt att-again is unknown; resolve attempt att-again first")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
	})

	t.Run("RefusedWhenNotUnknownOrElsewhere", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		b.admit(t, "other", "o1", "hello")
		_, err := b.resolve(t, "other", call.ID, recovery.FindingDidNotRun, "")
		require.ErrorContains(t, err, "belongs to session s")
		_, err = b.resolve(t, "s", "no-such-call", recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, ledger.ErrNoTarget)
		_, err = b.resolve(t, "s", call.AttemptID, recovery.FindingDidNotRun, "")
		require.ErrorIs(t, err, recovery.ErrNotUnknown, "the attempt succeeded")
		_, err = b.resolve(t, "s", call.AttemptID, recovery.FindingRan, `{}`)
		require.ErrorContains(t, err, "provider attempt")
		require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
	})

	t.Run("AttemptNotActedOnIsSentAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		att := b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		res, err := b.resolve(t, "s", att, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		require.NotEmpty(t, res.Resolution.ContinuationID)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'failed'`, att))
		b.run(t, &recorder{}, b.registry(t, &sideTool{}), "s")
		done := b.completed(t, "s")
		require.Len(t, done, 1)
		require.Equal(t, "echo: hello", done[0].Text)
		require.Equal(t, []string{"m1"}, done[0].MessageIDs)
	})

	t.Run("AttemptActedOnIsRecordedOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		att := b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")
		b.pass(t)
		res, err := b.resolve(t, "s", att, recovery.FindingRan, "")
		require.NoError(t, err)
		require.Empty(t, res.Resolution.ContinuationID, "its answer is lost: nothing to continue")
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'`, att))
		again, err := b.resolve(t, "s", att, recovery.FindingRan, "")
		require.NoError(t, err)
		require.True(t, again.Already)
	})

	t.Run("TwoOperatorsAtOnceRecordOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		before := b.wakes(t, "s")
		var wg sync.WaitGroup
		results := make([]recovery.ResolveResult, 4)
		errs := make([]error, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
			}()
		}
		wg.Wait()
		fresh := 0
		for i := range results {
			require.NoError(t, errs[i])
			if !results[i].Already {
				fresh++
			}
		}
		require.Equal(t, 1, fresh, "one of them records it")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM resolutions`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`))
		require.Equal(t, 1, b.wakes(t, "s")-before, "one wake")
	})

	t.Run("TransientErrorIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		short := b.poolWith(t, map[string]string{"lock_timeout": "100ms"})
		release := b.holdSession(t, "s")
		var transient []error
		res, err := recovery.Resolve(context.Background(), short, "s", call.ID, &recovery.ResolveOpts{
			Finding: recovery.FindingDidNotRun, Operator: "alice",
			OnTransientFunc: func(err error) {
				transient = append(transient, err)
				release() // the stuck writer goes away
			}})
		require.NoError(t, err)
		require.Len(t, transient, 1, "one lock timeout, then it went through")
		require.True(t, pgdb.Transient(transient[0]), "%v", transient[0])
		require.False(t, res.Already)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM resolutions`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`))
	})

	t.Run("ExplainShowsTheResolution", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		_, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{"appended":true}`)
		require.NoError(t, err)
		x, err := recovery.ExplainSession(context.Background(), b.pool, "s")
		require.NoError(t, err)
		require.Len(t, x.Records, 1)
		require.Len(t, x.Records[0].Resolutions, 1, "attached to the decision that reconciled the call")
		require.Empty(t, x.Unattached)
		var out bytes.Buffer
		recovery.Explain(&out, x.Records, x.Unattached...)
		require.Contains(t, out.String(), "Resolved: tool call "+call.ID+" (was unknown)")
		require.Contains(t, out.String(), `by alice ("checked the file")`)
		require.Contains(t, out.String(), `the model is handed the output "{\"appended\":true}"`)
		require.Contains(t, out.String(), "Continuation input "+recovery.ResolutionContinuationID(call.ID, 1)+": not yet promoted")
	})
}
