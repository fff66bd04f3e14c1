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
