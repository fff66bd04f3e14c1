package recovery_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// stallTool is the side-effecting append_line that performs its effect,
// then blocks until released before it answers: a process paused (or
// killed) after the dispatch and before its result is recorded.
type stallTool struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	runs    int
}

func newStallTool() *stallTool {
	return &stallTool{started: make(chan struct{}), release: make(chan struct{})}
}

func (s *stallTool) Spec() tools.Spec {
	return tools.Spec{Name: "append_line", Class: tools.SideEffecting, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (s *stallTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	s.mu.Lock()
	s.runs++
	s.mu.Unlock()
	s.once.Do(func() { close(s.started) })
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return tools.Result{Output: "appended"}, nil
}

func (s *stallTool) ran() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs
}

// zombieContinuation runs the continuation of a --did-not-run resolution
// on a real executor until its tool performed the re-armed call, then
// lets the lease run out and recovery reconcile it (the call unknown
// again), then lets the paused executor go on: it is fenced.
func (b *testBundle) zombieContinuation(t *testing.T, session string) *stallTool {
	t.Helper()
	tool := newStallTool()
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "zombie-process"})
	e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims, Provider: &recorder{}, Tools: b.registry(t, tool),
		ToolTimeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	defer e.StopNow()
	done, err := e.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	select {
	case <-tool.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the continuation never ran the re-armed call")
	}
	b.die(t, session)
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
	close(tool.release)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the fenced executor did not stop")
	}
	return tool
}

// TestResolveAdversarial: attacks on `consumer session resolve` found in
// review.
func TestResolveAdversarial(t *testing.T) {
	t.Parallel()

	// The operator's finding was about the first run. The continuation's
	// run of the re-armed call performed the side effect and died before
	// its result (a zombie, a kill): the call is unknown again. The same
	// command again (a retry of a command whose answer was lost, a
	// script, or Resolve's own retry after a commit that landed unheard)
	// is not "the same finding twice": it opens round 2 and runs the call
	// a second time, which no one vouched for (P4).
	// A resolved turn that fails again must say so with an event that a
	// consumer deduplicating on id (docs/session-events.md) does not drop,
	// naming an assistant message of its own, now errored, as
	// docs/session-events.md promises for outcome_unknown: "a
	// turn.completed (or another turn.failed) with the same message_ids and
	// a new assistant_message_id then follows".
	t.Run("SecondFailureIsANewEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		b.zombieContinuation(t, "s")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'unknown'`, call.ID))

		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 2, "the first reconcile and the reconcile of the resolution's continuation")
		require.Equal(t, envelope.FailOutcomeUnknown, failed[1].Reason)
		require.NotEqual(t, failed[0].ID, failed[1].ID,
			"the second turn.failed carries the first one's id: a consumer deduplicating on id never sees the resolved turn fail again")
		require.NotEqual(t, failed[0].AssistantMessageID, failed[1].AssistantMessageID,
			"docs/session-events.md: the failure after a resolution names a new assistant message")
		require.Equal(t, failed[0].MessageIDs, failed[1].MessageIDs, "the same turn")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND role = 'assistant' AND status = 'errored'`,
			failed[1].AssistantMessageID), "the message it names is in the transcript, errored")
	})

	t.Run("RepeatedCommandDoesNotVouchForASecondRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, call := b.unknownCall(t, "s")
		first, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		zombie := b.zombieContinuation(t, "s")
		require.Equal(t, 1, zombie.ran(), "the re-armed call ran once and its result was lost")

		again, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Equal(t, 1, zombie.ran()+len(tool.runs()),
			"the identical command, repeated, ran the side effect a second time (round %d, continuation %s) though the operator's finding was about round %d",
			again.Resolution.Round, again.Resolution.ContinuationID, first.Resolution.Round)
		if err == nil {
			require.True(t, again.Already, "the same finding twice must be a no-op (docs/design.md)")
		}
	})

	// A step's tool call that could not say how it went is unknown in
	// process (the model was told so), the turn went on, and its next
	// provider attempt was cut by a crash: recovery left that attempt
	// unknown too (its step's assistant message errored, which
	// refuseSuperseded lets through). A finding about the tool call alone
	// must not send that unknown step to the provider again: no one
	// vouched for it (P4 covers provider attempts as tool calls).
	t.Run("CallFindingDoesNotResendAnUnknownAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		c := b.startTurn(t, "s", "m1")
		att := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, att, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{"line":"x"}`})
		b.startCall(t, c, calls[0])
		require.NoError(t, c.x.WriteCallRetried(ctx, ledger.RetryOpts{}, "", "", ledger.CallSettleCall(calls[0].ID, att, ledger.CallUnknown,
			"outcome unknown: connection reset", true, calls[0].ModelCallID, ledger.Events{}), nil))
		step2 := ledger.AttemptID(c.x.Claim().ExecutionID, 2)
		require.NoError(t, c.x.Write(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, answers, turn_id, execution_id, fencing_token)
				VALUES ('asst-s-2', 's', 'assistant', 'pending', $1, 'asst-s', $2, $3)`, []string{"m1"}, c.x.Claim().ExecutionID, c.x.Claim().Token); err != nil {
				return err
			}
			return c.x.BeginAttempt(ctx, tx, ledger.AttemptParams{ID: step2, AssistantMessageID: "asst-s-2", Step: 2,
				Provider: "scripted", IdempotencyKey: step2, RequestHash: []byte{2}})
		}))
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'`, step2))

		res, err := b.resolve(t, "s", calls[0].ID, recovery.FindingRan, `{"appended":true}`)
		rec := &recorder{}
		b.run(t, rec, b.registry(t, &sideTool{}), "s")
		require.Empty(t, rec.all(), "a finding on tool call %s (continuation %q, err %v) sent the step of unknown attempt %s to the provider again",
			calls[0].ID, res.Resolution.ContinuationID, err, step2)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'`, step2))
	})
}
