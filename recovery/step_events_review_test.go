package recovery_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// lostTool is the side-effecting append_line that cannot say how it went:
// its call is unknown in process (tool.completed, outcome unknown).
type lostTool struct{}

func (lostTool) Spec() tools.Spec {
	return tools.Spec{Name: "append_line", Class: tools.SideEffecting, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (lostTool) Run(context.Context, tools.Call) (tools.Result, error) {
	return tools.Result{}, errors.New("connection reset")
}

// failAfterFirst answers the first step as the scripted provider does and
// fails every later one: the turn fails after its tool step.
type failAfterFirst struct {
	mu sync.Mutex
	n  int
}

func (f *failAfterFirst) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	if n > 1 {
		return provider.Response{}, errors.New("provider down")
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

// TestStepEventsAcrossResolution: step events of a turn an operator
// continued (consumer session resolve) against a consumer that
// deduplicates on id, as docs/session-events.md tells it to.
//
// It catches: two different outcomes of one call (the unknown one of its
// first run, the real one of the run an operator's --did-not-run vouched
// for) announced under one id, so that the deduplicating consumer keeps
// "unknown" and never learns the call succeeded; the re-run's dispatch
// under the first run's tool.started id, so that it never sees the call
// start again.
func TestStepEventsAcrossResolution(t *testing.T) {
	t.Parallel()

	t.Run("RerunOutcomeHasItsOwnID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		b.run(t, &failAfterFirst{}, b.registry(t, lostTool{}), "s")
		first := testkit.SessionEvents(t, b.pool, "s", envelope.EventToolCompleted)
		require.Len(t, first, 1)
		require.Equal(t, "unknown", first[0].Outcome)
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed), 1)

		_, err := b.resolve(t, "s", first[0].CallID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Len(t, tool.runs(), 1, "the continuation runs the re-armed call")

		done := testkit.SessionEvents(t, b.pool, "s", envelope.EventToolCompleted)
		require.Len(t, done, 2)
		require.Equal(t, first[0].CallID, done[1].CallID)
		require.Equal(t, "succeeded", done[1].Outcome)
		require.NotEqual(t, done[0].ID, done[1].ID,
			"two outcomes of call %s share the id %s: a consumer deduplicating on id keeps %q and loses %q",
			done[0].CallID, done[0].ID, done[0].Outcome, done[1].Outcome)

		// The re-run is a second dispatch, which the operator vouched for:
		// a UI must see the call running again.
		started := testkit.SessionEvents(t, b.pool, "s", envelope.EventToolStarted)
		require.Len(t, started, 2)
		require.Equal(t, started[0].CallID, started[1].CallID)
		require.NotEqual(t, started[0].ID, started[1].ID,
			"the re-run's dispatch shares the first run's id %s: a consumer deduplicating on id never sees it start", started[0].ID)
	})

	// Recovery decides the outcome of the calls a dead process left: a
	// started one unknown, one never dispatched interrupted. The ledger
	// has those outcomes; the events must say them, or a UI shows a call
	// that tool.started began as running for good.
	t.Run("ReconciledCallsHaveTheirOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", `/tool echo {}`)
		c := b.startTurn(t, "s", "m1")
		att := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, att, map[string]string{"echo": "side_effecting", "append_line": "side_effecting"},
			map[string]string{"echo": `{}`, "append_line": `{"line":"x"}`})
		b.startCall(t, c, calls[0])
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])

		done := testkit.SessionEvents(t, b.pool, "s", envelope.EventToolCompleted)
		require.Len(t, done, 2, "one tool.completed per call recovery settled")
		schema := testkit.EventSchema(t)
		for i, want := range []ledger.CallState{ledger.CallUnknown, ledger.CallInterrupted} {
			e := done[i]
			require.Equal(t, calls[i].ID, e.CallID)
			require.Equal(t, string(want), e.Outcome)
			require.Equal(t, calls[i].ModelCallID, e.ModelCallID)
			require.Equal(t, calls[i].Tool, e.Tool)
			require.Equal(t, calls[i].Class, e.Class)
			require.Equal(t, c.assistant, e.TurnID)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = $2`, e.CallID, want),
				"the event says the ledger's outcome")
			requireValid(t, schema, e)
		}
		require.NotEqual(t, done[0].ID, done[1].ID)
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
	})

	// An operator found that the unknown call ran: the ledger's outcome is
	// succeeded from then on, and the continuation goes on with the given
	// output. The events must say so too.
	t.Run("RanFindingAnnouncesTheOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c, call := b.unknownCall(t, "s")
		_, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{"appended":true}`)
		require.NoError(t, err)
		again, err := b.resolve(t, "s", call.ID, recovery.FindingRan, `{"appended":true}`)
		require.NoError(t, err)
		require.True(t, again.Already)

		var outcomes, ids []string
		for _, e := range testkit.SessionEvents(t, b.pool, "s", envelope.EventToolCompleted) {
			require.Equal(t, call.ID, e.CallID)
			require.Equal(t, c.assistant, e.TurnID)
			requireValid(t, testkit.EventSchema(t), e)
			outcomes, ids = append(outcomes, e.Outcome), append(ids, e.ID)
		}
		require.NotEmpty(t, outcomes, "no tool.completed for call %s", call.ID)
		require.Equal(t, string(ledger.CallSucceeded), outcomes[len(outcomes)-1], "the latest tool.completed is the call's outcome")
		require.Len(t, outcomes, 2, "unknown (recovery), then succeeded (the finding), once however often it is resolved: %v", outcomes)
		require.NotEqual(t, ids[0], ids[1])
	})
}

// TestStepNumbersAcrossResolution: a step whose provider attempt was cut
// by a crash never completed (no step.completed); an operator found it
// was not sent, and the continuation sends that step again. Its
// step.completed must carry the number of the step it sends again, as
// recovery's own re-send does (it answers in the same message): a UI that
// counts step.completed events must not see step 2 as the turn's first.
func TestStepNumbersAcrossResolution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.admit(t, "s", "m1", "hello")
	c := b.startTurn(t, "s", "m1")
	att := b.beginAttempt(t, c, 1, "scripted")
	b.die(t, "s")
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'`, att))

	_, err := b.resolve(t, "s", att, recovery.FindingDidNotRun, "")
	require.NoError(t, err)
	b.run(t, &recorder{}, nil, "s")
	require.Len(t, b.completed(t, "s"), 1, "the continuation answered")
	steps := testkit.SessionEvents(t, b.pool, "s", envelope.EventStepCompleted)
	require.Len(t, steps, 1)
	require.Equal(t, c.assistant, steps[0].TurnID)
	require.Equal(t, 1, steps[0].Step, "the step sent again is the turn's first completed step, not a step after the one that never completed")
}

func requireValid(t *testing.T, s *jsonschema.Schema, e envelope.Event) {
	t.Helper()
	b, err := json.Marshal(e)
	require.NoError(t, err)
	testkit.RequireValid(t, s, b)
}
