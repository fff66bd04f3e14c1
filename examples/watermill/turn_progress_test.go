package eventsconsumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// TestTurnProgress runs TurnProgress behind the router against the
// embedded broker, on a turn's step events as promptline publishes them
// after a crash and a recovery: the relay's repeats, and a re-run call's
// tool.started again under an id of its own.
func TestTurnProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	ev := func(e envelope.Event) record {
		e.SessionID, e.At = "sess-1", at
		return record{session: "sess-1", event: &e}
	}
	call := envelope.EventToolCall{CallID: "x1/attempt-1/call-0", ModelCallID: "call-0", Tool: "echo", Class: "idempotent"}
	started := ev(envelope.Event{ID: "tool.started:" + call.CallID + "@1", Type: envelope.EventToolStarted, TurnID: "t1",
		CallID: call.CallID, ModelCallID: call.ModelCallID, Tool: call.Tool, Class: call.Class})
	restarted := ev(envelope.Event{ID: "tool.started:" + call.CallID + "@2", Type: envelope.EventToolStarted, TurnID: "t1",
		CallID: call.CallID, ModelCallID: call.ModelCallID, Tool: call.Tool, Class: call.Class})
	b.publish(t, []record{
		ev(envelope.Event{ID: "input.admitted:m1", Type: envelope.EventInputAdmitted, MessageID: "m1"}),
		ev(envelope.Event{ID: "turn.started:t1", Type: envelope.EventTurnStarted, TurnID: "t1", MessageIDs: []string{"m1"}}),
		ev(envelope.Event{ID: "step.completed:t1", Type: envelope.EventStepCompleted, TurnID: "t1", MessageIDs: []string{"m1"},
			AssistantMessageID: "t1", Step: 1, Text: "looking", ToolCalls: []envelope.EventToolCall{call}}),
		started,
		ev(envelope.Event{ID: "turn.recovered:x1", Type: envelope.EventTurnRecovered, TurnID: "t1", MessageIDs: []string{"m1"},
			AssistantMessageID: "t1", ExecutionID: "x1", ContinuationMessageID: "recovery-continue-x1"}),
		started,   // the relay publishes it again
		restarted, // the continuation re-runs the idempotent call
		ev(envelope.Event{ID: "tool.completed:" + call.CallID + "@2", Type: envelope.EventToolCompleted, TurnID: "t1",
			CallID: call.CallID, ModelCallID: call.ModelCallID, Tool: call.Tool, Class: call.Class, Outcome: "succeeded"}),
		ev(envelope.Event{ID: "step.completed:a2", Type: envelope.EventStepCompleted, TurnID: "t1", MessageIDs: []string{"m1"},
			AssistantMessageID: "a2", Step: 2, Text: "tool results: echo: x"}),
		ev(envelope.Event{ID: "turn.completed:a2", Type: envelope.EventTurnCompleted, MessageIDs: []string{"m1"},
			AssistantMessageID: "a2", Text: "tool results: echo: x"}),
	})

	progress := NewTurnProgress()
	router, err := NewEventsRouter(progress.Handle, slog.New(slog.DiscardHandler),
		&Config{Brokers: []string{b.addr}, Group: group + "-progress", Types: ProgressTypes})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ran)
	})

	require.Eventually(t, func() bool {
		turn, ok := progress.Turn("t1")
		return ok && turn.Done
	}, 60*time.Second, 20*time.Millisecond, "turn t1 never done")
	turn, _ := progress.Turn("t1")
	require.Equal(t, 2, turn.Steps)
	require.Equal(t, []string{"looking", "tool results: echo: x"}, turn.Text)
	require.Empty(t, turn.Running, "the re-run call's start and its completion are one call")
	require.Equal(t, map[string]string{call.CallID: "succeeded"}, turn.Outcomes)
	require.True(t, turn.Recovered)
	require.Empty(t, turn.Reason)
}
