package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func eventJSON(t *testing.T, e envelope.Event) [2]string {
	t.Helper()
	if e.At.IsZero() {
		e.At = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	return [2]string{e.SessionID, string(b)}
}

func TestWatch(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) string {
		t.Helper()
		return testkit.Broker(t, 4).Addr()
	}

	t.Run("FromBeginningFiltersAndCount", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		hello := eventJSON(t, envelope.Event{ID: "e-2", Type: envelope.EventTurnCompleted, SessionID: "s-1", MessageIDs: []string{"m-1"}, Text: "echo: hello"})
		produce(t, addr, "session-events",
			eventJSON(t, envelope.Event{ID: "e-1", Type: envelope.EventInputAdmitted, SessionID: "s-1", MessageID: "m-1"}),
			hello,
			hello, // the relay publishes at least once: a repeat is skipped
			[2]string{"s-1", "not json"},
			eventJSON(t, envelope.Event{ID: "e-3", Type: envelope.EventTurnCompleted, SessionID: "s-2", Text: "other session"}),
			eventJSON(t, envelope.Event{ID: "e-4", Type: envelope.EventTurnFailed, SessionID: "s-1", Reason: envelope.FailProviderError, Error: "boom"}),
			eventJSON(t, envelope.Event{ID: "e-5", Type: envelope.EventTurnCompleted, SessionID: "s-1", Text: "echo: again\nand more"}),
			eventJSON(t, envelope.Event{ID: "e-6", Type: envelope.EventTurnCompleted, SessionID: "s-1", Text: "past the count"}),
		)

		res := runCLI(t.Context(), "", "watch", "--brokers", addr, "--from-beginning",
			"--session", "s-1", "--type", "turn.completed", "--type", "turn.failed", "--count", "3", "--timeout", "30s")
		require.NoError(t, res.err, res.stderr)
		require.Equal(t, `s-1 turn.completed "echo: hello"
s-1 turn.failed reason=provider_error error="boom"
s-1 turn.completed "echo: again\nand more"
`, res.stdout)
		// One session's events are all on its partition: only that one is read.
		require.Contains(t, res.stderr, fmt.Sprintf("watching session-events (partition %d of 4: session s-1) from the oldest offsets",
			kafkautil.Murmur2Partition([]byte("s-1"), 4)))
		require.Contains(t, res.stderr, "not a session event")
	})

	t.Run("NewestOffsetsJSON", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		produce(t, addr, "session-events", eventJSON(t, envelope.Event{ID: "old", Type: envelope.EventTurnCompleted, SessionID: "s-1", Text: "before the watch"}))

		stdout, stderr := testkit.NewSyncBuffer(), testkit.NewSyncBuffer()
		root := newRootCommand(strings.NewReader(""), stdout, stderr)
		root.SetArgs([]string{"watch", "--brokers", addr, "--json", "--count", "2", "--timeout", "30s"})
		done := make(chan error, 1)
		go func() { done <- root.ExecuteContext(t.Context()) }()
		stderr.WaitFor(t, "watching session-events (4 partitions) from the newest offsets", 30*time.Second)

		produce(t, addr, "session-events",
			eventJSON(t, envelope.Event{ID: "new-1", Type: envelope.EventInputAdmitted, SessionID: "s-1", MessageID: "m-1"}),
			eventJSON(t, envelope.Event{ID: "new-2", Type: envelope.EventTurnCompleted, SessionID: "s-2", Text: "hi"}),
		)
		require.NoError(t, <-done, stderr.String())

		var ids []string
		for line := range strings.Lines(stdout.String()) {
			e, err := envelope.DecodeEvent([]byte(line))
			require.NoError(t, err, line)
			ids = append(ids, e.ID)
		}
		require.ElementsMatch(t, []string{"new-1", "new-2"}, ids)
	})

	t.Run("TimeoutBeforeCount", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)
		produce(t, addr, "session-events", eventJSON(t, envelope.Event{ID: "e-1", Type: envelope.EventTurnCompleted, SessionID: "s-1", Text: "one"}))

		res := runCLI(t.Context(), "", "watch", "--brokers", addr, "--from-beginning", "--count", "2", "--timeout", "300ms")
		require.EqualError(t, res.err, "--timeout: 300ms passed with 1 of 2 matching events")
		require.Equal(t, "s-1 turn.completed \"one\"\n", res.stdout)
	})

	t.Run("TimeoutWithoutCount", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		res := runCLI(t.Context(), "", "watch", "--brokers", addr, "--timeout", "100ms")
		require.NoError(t, res.err)
		require.Empty(t, res.stdout)
	})

	t.Run("Interrupted", func(t *testing.T) {
		t.Parallel()
		addr := setup(t)

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res := runCLI(ctx, "", "watch", "--brokers", addr, "--count", "1")
		require.EqualError(t, res.err, "interrupted with 0 of 1 matching events")
	})
}

func TestFormatEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		e    envelope.Event
		want string
	}{
		{envelope.Event{SessionID: "s-1", Type: "turn.completed", Text: "echo: hello", MessageIDs: []string{"m-1"}}, `s-1 turn.completed "echo: hello"`},
		{envelope.Event{SessionID: "s-1", Type: "input.admitted", MessageID: "m-1"}, `s-1 input.admitted message_id=m-1`},
		{envelope.Event{SessionID: "s-1", Type: "turn.failed", Reason: "unsupported", Error: "no \"tools\""}, `s-1 turn.failed reason=unsupported error="no \"tools\""`},
		{envelope.Event{SessionID: "s-1", Type: "something.new"}, `s-1 something.new`},
		{envelope.Event{SessionID: "s-1", Type: "turn.started", TurnID: "t-1", MessageIDs: []string{"m-1"}}, `s-1 turn.started`},
		{envelope.Event{SessionID: "s-1", Type: "step.completed", Step: 1, Text: "looking", ToolCalls: []envelope.EventToolCall{{Tool: "echo"}, {Tool: "append_line"}}},
			`s-1 step.completed step=1 call=echo call=append_line "looking"`},
		{envelope.Event{SessionID: "s-1", Type: "tool.started", Tool: "echo", Class: "idempotent"}, `s-1 tool.started tool=echo class=idempotent`},
		{envelope.Event{SessionID: "s-1", Type: "tool.completed", Tool: "echo", Class: "idempotent", Outcome: "unknown"},
			`s-1 tool.completed tool=echo class=idempotent outcome=unknown`},
		{envelope.Event{SessionID: "s-1", Type: "turn.recovered", ContinuationMessageID: "recovery-continue-x"}, `s-1 turn.recovered continuation=recovery-continue-x`},
		// What `producer reply` needs, never the call's input (it may hold secrets).
		{envelope.Event{SessionID: "s-1", Type: "permission.asked", Tool: "echo", RequestID: "r", Input: []byte(`{"token":"x"}`)},
			`s-1 permission.asked request_id=r tool=echo`},
		{envelope.Event{SessionID: "s-1", Type: "permission.replied", RequestID: "r", Reply: "once"}, `s-1 permission.replied request_id=r reply=once`},
		{envelope.Event{SessionID: "s-1", Type: "recovery.decided", ExecutionID: "x", Decision: "continued", Rule: "idempotent_tool_retry", ContinuationMessageID: "recovery-continue-x"},
			`s-1 recovery.decided decision=continued rule=idempotent_tool_retry continuation=recovery-continue-x`},
		{envelope.Event{SessionID: "s-1", Type: "recovery.decided", ExecutionID: "x", Decision: "reconciled"}, `s-1 recovery.decided decision=reconciled`},
	} {
		require.Equal(t, tc.want, formatEvent(tc.e))
	}
}

// TestWatchDeltas feeds watch --deltas' printer a turn as the two topics
// may interleave it: deltas appended on one line, a seq 1 again starting
// the step over on a new line, a repeat dropped, the step.completed line
// closing the deltas line, and a delta after step.completed (a straggler,
// or a zombie's) and after the turn's end dropped.
func TestWatchDeltas(t *testing.T) {
	t.Parallel()
	delta := func(amid string, step int, seq int64, text string) envelope.Delta {
		return envelope.Delta{SessionID: "s-1", TurnID: "a-1", AssistantMessageID: amid, Step: step, Seq: seq, Text: text}
	}
	type rec struct {
		d *envelope.Delta
		e envelope.Event
	}
	feed := []rec{
		{d: ptr(delta("a-1", 1, 1, "Hel"))},
		{d: ptr(delta("a-1", 1, 2, "lo\n"))},
		{d: ptr(delta("a-1", 1, 2, "lo\n"))}, // a repeat
		{d: ptr(delta("a-1", 1, 1, "Hi"))},   // sent again: starts over
		{d: ptr(delta("a-1", 1, 2, ", you"))},
		{e: envelope.Event{ID: "e-1", Type: envelope.EventStepCompleted, SessionID: "s-1", TurnID: "a-1", AssistantMessageID: "a-1", Step: 1, Text: "Hi, you"}},
		{d: ptr(delta("a-1", 1, 3, " late"))}, // after step.completed: dropped
		{d: ptr(delta("a-2", 2, 1, "mo"))},
		{e: envelope.Event{ID: "e-x", Type: envelope.EventInputAdmitted, SessionID: "s-1", MessageID: "m-2"}},
		{d: ptr(delta("a-2", 2, 2, "re"))},
		{e: envelope.Event{ID: "e-2", Type: envelope.EventTurnCompleted, SessionID: "s-1", AssistantMessageID: "a-3", Text: "done"}},
		{d: ptr(delta("a-9", 3, 1, "never shown"))},
		{e: envelope.Event{ID: "e-3", Type: envelope.EventTurnFailed, SessionID: "s-1", AssistantMessageID: "a-9", Reason: "outcome_unknown"}},
		{d: ptr(delta("a-9", 3, 2, " dropped"))},
	}
	run := func(json bool, types ...string) string {
		var out strings.Builder
		o := &watchOpts{json: json, deltas: true, types: types, view: newDeltaView()}
		for _, r := range feed {
			if r.d != nil {
				raw, err := jsonMarshal(*r.d)
				require.NoError(t, err)
				require.NoError(t, o.printDelta(&out, *r.d, raw))
				continue
			}
			o.view.event(r.e)
			if len(types) > 0 && !contains(types, r.e.Type) {
				continue
			}
			raw, err := jsonMarshal(r.e)
			require.NoError(t, err)
			require.NoError(t, o.print(&out, r.e, raw))
		}
		require.NoError(t, o.endLine(&out))
		return out.String()
	}

	require.Equal(t, `s-1 deltas step=1 "Hello\n"
s-1 deltas step=1 "Hi, you"
s-1 step.completed step=1 "Hi, you"
s-1 deltas step=2 "mo"
s-1 input.admitted message_id=m-2
s-1 deltas step=2 ..."re"
s-1 turn.completed "done"
s-1 deltas step=3 "never shown"
s-1 turn.failed reason=outcome_unknown
`, run(false))
	// --type leaves step.completed unprinted; it still settles its step.
	require.Equal(t, `s-1 deltas step=1 "Hello\n"
s-1 deltas step=1 "Hi, you"
s-1 deltas step=2 "more"
s-1 turn.completed "done"
s-1 deltas step=3 "never shown"
`, run(false, envelope.EventTurnCompleted))

	var seqs []string
	for line := range strings.Lines(run(true)) {
		if d, err := envelope.DecodeDelta([]byte(line)); err == nil {
			seqs = append(seqs, fmt.Sprintf("%s/%d", d.AssistantMessageID, d.Seq))
		}
	}
	require.Equal(t, []string{"a-1/1", "a-1/2", "a-1/1", "a-1/2", "a-2/1", "a-2/2", "a-9/1"}, seqs, "--json keeps the same deltas")
}

func ptr[T any](v T) *T { return &v }

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
