package scripted_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
)

// /loop asks for its call at every step, after tool results too, so a
// turn driven by it ends at the step limit; /tool asks once.
func TestScriptedProviderLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	turn := []provider.TranscriptMessage{{Role: "user", Text: `/loop echo {"text":"again"}`}}
	first, err := scripted.ScriptedProvider{}.Complete(ctx, provider.Request{Turn: turn, Messages: turn})
	require.NoError(t, err)
	require.Len(t, first.ToolCalls, 1)
	require.Equal(t, "echo", first.ToolCalls[0].Name)
	require.JSONEq(t, `{"text":"again"}`, string(first.ToolCalls[0].Input))

	after := append(turn, provider.TranscriptMessage{Role: "assistant", ToolCalls: first.ToolCalls},
		provider.TranscriptMessage{Role: "tool", ToolCallID: first.ToolCalls[0].ID, Text: "again"})
	next, err := scripted.ScriptedProvider{}.Complete(ctx, provider.Request{Turn: turn, Messages: after})
	require.NoError(t, err)
	require.Len(t, next.ToolCalls, 1, "after tool results, /loop asks again")

	once := []provider.TranscriptMessage{{Role: "user", Text: `/tool echo {"text":"once"}`}}
	done, err := scripted.ScriptedProvider{}.Complete(ctx, provider.Request{Turn: once, Messages: append(once,
		provider.TranscriptMessage{Role: "tool", Text: "once"})})
	require.NoError(t, err)
	require.Empty(t, done.ToolCalls, "/tool asks once")
}

// /stream hands the answer to TextDeltaFunc a word at a time; the
// fragments make up the answer, which is returned whole as always.
func TestScriptedProviderStream(t *testing.T) {
	t.Parallel()
	turn := []provider.TranscriptMessage{{Role: "user", Text: "/stream 1ms\n/reply one two three"}}
	var fragments []string
	resp, err := scripted.ScriptedProvider{}.Complete(context.Background(), provider.Request{Turn: turn, Messages: turn,
		TextDeltaFunc: func(s string) { fragments = append(fragments, s) }})
	require.NoError(t, err)
	require.Equal(t, "one two three", resp.Text)
	require.Equal(t, []string{"one ", "two ", "three"}, fragments)

	resp, err = scripted.ScriptedProvider{}.Complete(context.Background(), provider.Request{Turn: turn, Messages: turn})
	require.NoError(t, err)
	require.Equal(t, "one two three", resp.Text, "without a delta func: the answer only")

	_, err = scripted.ScriptedProvider{}.Complete(context.Background(), provider.Request{
		Turn: []provider.TranscriptMessage{{Role: "user", Text: "/stream soon"}}, TextDeltaFunc: func(string) {}})
	require.ErrorContains(t, err, `/stream "soon"`)
}

// /sleep waits in a turn's first step only, /sleep-after-tools in the
// steps that answer tool results only: a step that waits returns its
// context's error when the context has ended, one that does not answers.
func TestScriptedProviderSleeps(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	turn := []provider.TranscriptMessage{{Role: "user", Text: "/tool echo {\"text\":\"x\"}\n/sleep 1h\n/sleep-after-tools 2h"}}
	afterTools := append(turn[:1:1], provider.TranscriptMessage{Role: "tool", ToolCallID: "call-0", Text: "x"})

	_, err := scripted.ScriptedProvider{}.Complete(ended, provider.Request{Turn: turn, Messages: turn})
	require.ErrorIs(t, err, context.Canceled, "the first step waits for /sleep")
	_, err = scripted.ScriptedProvider{}.Complete(ended, provider.Request{Turn: turn, Messages: afterTools})
	require.ErrorIs(t, err, context.Canceled, "the step after tool results waits for /sleep-after-tools")

	first := []provider.TranscriptMessage{{Role: "user", Text: "/tool echo {\"text\":\"x\"}\n/sleep-after-tools 2h"}}
	resp, err := scripted.ScriptedProvider{}.Complete(ended, provider.Request{Turn: first, Messages: first})
	require.NoError(t, err, "the first step does not wait for /sleep-after-tools")
	require.Len(t, resp.ToolCalls, 1)
	second := []provider.TranscriptMessage{{Role: "user", Text: "/tool echo {\"text\":\"x\"}\n/sleep 1h"}}
	resp, err = scripted.ScriptedProvider{}.Complete(ended, provider.Request{Turn: second,
		Messages: append(second[:1:1], provider.TranscriptMessage{Role: "tool", ToolCallID: "call-0", Text: "x"})})
	require.NoError(t, err, "a step after tool results does not wait for /sleep")
	require.Contains(t, resp.Text, "tool results:")

	_, err = scripted.ScriptedProvider{}.Complete(context.Background(), provider.Request{Turn: []provider.TranscriptMessage{
		{Role: "user", Text: "/sleep-after-tools soon"}}, Messages: afterTools})
	require.ErrorContains(t, err, `/sleep-after-tools "soon"`)
}
