package recovery_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/pipeline"
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

func (f *failAfterFirst) Complete(ctx context.Context, req pipeline.ProviderRequest) (pipeline.ProviderResponse, error) {
	f.mu.Lock()
	f.n++
	n := f.n
	f.mu.Unlock()
	if n > 1 {
		return pipeline.ProviderResponse{}, errors.New("provider down")
	}
	return pipeline.ScriptedProvider{}.Complete(ctx, req)
}

// TestStepEventsAcrossResolution: step events of a turn an operator
// continued (consumer session resolve) against a consumer that
// deduplicates on id, as docs/session-events.md tells it to.
//
// It catches: two different outcomes of one call (the unknown one of its
// first run, the real one of the run an operator's --did-not-run vouched
// for) announced under one id, so that the deduplicating consumer keeps
// "unknown" and never learns the call succeeded.
func TestStepEventsAcrossResolution(t *testing.T) {
	t.Parallel()

	t.Run("RerunOutcomeHasItsOwnID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		b.run(t, &failAfterFirst{}, b.registry(t, lostTool{}), "s")
		first := b.outboxEvents(t, "s", envelope.EventToolCompleted)
		require.Len(t, first, 1)
		require.Equal(t, "unknown", first[0].Outcome)
		require.Len(t, b.outboxEvents(t, "s", envelope.EventTurnFailed), 1)

		_, err := b.resolve(t, "s", first[0].CallID, recovery.FindingDidNotRun, "")
		require.NoError(t, err)
		tool := &sideTool{}
		b.run(t, &recorder{}, b.registry(t, tool), "s")
		require.Len(t, tool.runs(), 1, "the continuation runs the re-armed call")

		done := b.outboxEvents(t, "s", envelope.EventToolCompleted)
		require.Len(t, done, 2)
		require.Equal(t, first[0].CallID, done[1].CallID)
		require.Equal(t, "succeeded", done[1].Outcome)
		require.NotEqual(t, done[0].ID, done[1].ID,
			"two outcomes of call %s share the id %s: a consumer deduplicating on id keeps %q and loses %q",
			done[0].CallID, done[0].ID, done[0].Outcome, done[1].Outcome)
	})
}
