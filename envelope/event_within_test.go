package envelope_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

func TestMarshalWithin(t *testing.T) {
	t.Parallel()

	base := envelope.Event{ID: "turn.completed:a", Type: envelope.EventTurnCompleted, SessionID: "s",
		MessageIDs: []string{"m"}, AssistantMessageID: "a"}
	decode := func(t *testing.T, b []byte) envelope.Event {
		t.Helper()
		e, err := envelope.DecodeEvent(b)
		require.NoError(t, err)
		return e
	}

	t.Run("AnEventThatFitsIsWhole", func(t *testing.T) {
		t.Parallel()
		e := base
		e.Text = "<b>x</b> & y"
		b := e.MarshalWithin(1000)
		require.Contains(t, string(b), `"text":"<b>x</b> & y"`, "HTML's characters written as they are")
		require.Equal(t, e, decode(t, b))
		require.NotContains(t, string(b), "truncated")
	})

	t.Run("TextCutAtACharacterToFit", func(t *testing.T) {
		t.Parallel()
		e := base
		e.Text = strings.Repeat("é€", 10_000) // 2- and 3-byte characters
		for _, limit := range []int{200, 201, 202, 203, 5_000, 49_999} {
			b := e.MarshalWithin(limit)
			require.LessOrEqual(t, len(b), limit)
			got := decode(t, b)
			require.True(t, got.Truncated)
			require.True(t, utf8.ValidString(got.Text))
			require.True(t, strings.HasPrefix(e.Text, got.Text))
			require.Greater(t, len(b), limit-4, "no more cut than a character needs")
		}
	})

	t.Run("EscapedCharactersCountAsWritten", func(t *testing.T) {
		t.Parallel()
		e := base
		e.Text = strings.Repeat("\"\n\x01", 20_000)
		b := e.MarshalWithin(10_000)
		require.LessOrEqual(t, len(b), 10_000)
		got := decode(t, b)
		require.True(t, got.Truncated)
		require.True(t, strings.HasPrefix(e.Text, got.Text))
	})

	t.Run("ErrorCutToo", func(t *testing.T) {
		t.Parallel()
		e := base
		e.Type, e.Reason, e.Error = envelope.EventTurnFailed, envelope.FailProviderError, strings.Repeat("x", 50_000)
		e.Text = strings.Repeat("y", 30_000)
		b := e.MarshalWithin(20_000)
		require.LessOrEqual(t, len(b), 20_000)
		got := decode(t, b)
		require.True(t, got.Truncated)
		require.Equal(t, envelope.FailProviderError, got.Reason)
		require.NotEmpty(t, got.Error)
		require.NotEmpty(t, got.Text, "both keep a part")
	})

	t.Run("InputLeftOutNotCut", func(t *testing.T) {
		t.Parallel()
		e := envelope.Event{ID: "permission.asked:r", Type: envelope.EventPermissionAsked, SessionID: "s", RequestID: "r", Tool: "t",
			Input: json.RawMessage(`{"text":"` + strings.Repeat("x", 5_000) + `"}`)}
		b := e.MarshalWithin(1_000)
		require.LessOrEqual(t, len(b), 1_000)
		got := decode(t, b)
		require.True(t, got.Truncated)
		require.Nil(t, got.Input)
		require.Equal(t, "r", got.RequestID)
	})

	t.Run("WhatCannotBeCutIsReturnedWhole", func(t *testing.T) {
		t.Parallel()
		e := base
		e.MessageIDs = make([]string, 1_000)
		for i := range e.MessageIDs {
			e.MessageIDs[i] = strings.Repeat("m", 100)
		}
		b := e.MarshalWithin(10_000)
		require.Greater(t, len(b), 10_000, "the relay quarantines it")
		require.Len(t, decode(t, b).MessageIDs, 1_000)
	})

	t.Run("NoBound", func(t *testing.T) {
		t.Parallel()
		e := base
		e.Text = strings.Repeat("x", 10_000)
		require.Equal(t, e, decode(t, e.MarshalWithin(0)))
	})
}

func TestMarshalWithinCutsToolCalls(t *testing.T) {
	t.Parallel()
	e := envelope.Event{ID: "step.completed:a", Type: envelope.EventStepCompleted, SessionID: "s", TurnID: "a",
		MessageIDs: []string{"m"}, AssistantMessageID: "a", Step: 1, Text: "calling"}
	for i := range 5_000 {
		e.ToolCalls = append(e.ToolCalls, envelope.EventToolCall{CallID: fmt.Sprintf("a/call-%d", i), ModelCallID: fmt.Sprintf("m%d", i), Tool: "echo", Class: "idempotent"})
	}
	for _, limit := range []int{400, 1_000, 50_000, 300_000} {
		b := e.MarshalWithin(limit)
		require.LessOrEqual(t, len(b), limit)
		got, err := envelope.DecodeEvent(b)
		require.NoError(t, err)
		require.True(t, got.Truncated)
		require.Equal(t, "calling", got.Text, "the calls are cut before the text")
		for i, c := range got.ToolCalls {
			require.Equal(t, e.ToolCalls[i], c, "the first calls")
		}
		if limit > 1_000 {
			require.Greater(t, len(b), limit*9/10, "cut by the calls' average size, not much more")
		}
	}
}

// A step.completed whose answer alone is too large keeps its first tool
// call and has its text cut: tool_calls absent says the step asked for
// none, the turn's answer (docs/session-events.md), and a watcher would
// wait for a turn.completed while the turn runs the calls.
func TestMarshalWithinKeepsACallOfAStepThatAskedForCalls(t *testing.T) {
	t.Parallel()
	e := envelope.Event{ID: "step.completed:a", Type: envelope.EventStepCompleted, SessionID: "s", TurnID: "a",
		MessageIDs: []string{"m"}, AssistantMessageID: "a", Step: 1, Text: strings.Repeat("x", 2_000_000)}
	for i := range 3 {
		e.ToolCalls = append(e.ToolCalls, envelope.EventToolCall{CallID: fmt.Sprintf("a/call-%d", i), ModelCallID: fmt.Sprintf("m%d", i), Tool: "echo", Class: "idempotent"})
	}
	for _, limit := range []int{400, 1_000_000} {
		b := e.MarshalWithin(limit)
		require.LessOrEqual(t, len(b), limit)
		got, err := envelope.DecodeEvent(b)
		require.NoError(t, err)
		require.True(t, got.Truncated)
		require.NotEmpty(t, got.ToolCalls, "limit %d: a step that asked for calls still names one", limit)
		require.Equal(t, e.ToolCalls[0], got.ToolCalls[0])
		require.True(t, strings.HasPrefix(e.Text, got.Text))
	}
}
