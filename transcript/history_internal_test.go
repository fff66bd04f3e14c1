package transcript

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
)

// A provider never receives a tool call without its result: missing
// results are represented as errors right after their call's results, and
// results whose call is not in the transcript are dropped.
func TestSettleOrphans(t *testing.T) {
	t.Parallel()
	in := []provider.TranscriptMessage{
		{ID: "u1", Role: "user", Text: "go"},
		{ID: "a1", Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "c1", Name: "echo"}, {ID: "c2", Name: "append_line"}}},
		{ID: "r1", Role: "tool", ToolCallID: "c1", Text: "ok"},
		{ID: "stray", Role: "tool", ToolCallID: "c-nowhere", Text: "?"},
		{ID: "u2", Role: "user", Text: "next"},
	}
	out := SettleOrphans(in)
	require.Equal(t, []string{"u1", "a1", "r1", "c2/unsettled", "u2"}, msgIDs(out))
	missing := out[3]
	require.Equal(t, "tool", missing.Role)
	require.Equal(t, "c2", missing.ToolCallID)
	require.True(t, missing.IsError)
	require.Equal(t, UnsettledResult, missing.Text)
	// Settled transcripts pass through unchanged.
	require.Equal(t, msgIDs(out), msgIDs(SettleOrphans(out)))
}

// A call ID the model used again in a later step: the earlier call's
// result does not answer the later call, which gets its synthetic result
// (a provider refuses a call without one, and would refuse every later
// step of the session).
func TestSettleOrphansCallIDUsedAgain(t *testing.T) {
	t.Parallel()
	in := []provider.TranscriptMessage{
		{ID: "u1", Role: "user", Text: "go"},
		{ID: "a1", Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "call-1", Name: "echo"}}},
		{ID: "r1", Role: "tool", ToolCallID: "call-1", Text: "ok"},
		{ID: "a2", Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "call-1", Name: "append_line"}}},
		{ID: "u2", Role: "user", Text: "next"},
	}
	out := SettleOrphans(in)
	require.Equal(t, []string{"u1", "a1", "r1", "a2", "call-1/unsettled", "u2"}, msgIDs(out))
	require.Equal(t, msgIDs(out), msgIDs(SettleOrphans(out)))

	// A result before any call of its ID answers nothing.
	out = SettleOrphans([]provider.TranscriptMessage{{ID: "early", Role: "tool", ToolCallID: "call-9"}, in[0]})
	require.Equal(t, []string{"u1"}, msgIDs(out))
}

func msgIDs(ms []provider.TranscriptMessage) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}
