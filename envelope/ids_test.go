package envelope_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

func TestIsToolCallID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{
		envelope.ToolCallID("01a252ff-00c9-77d7-83c4-f0dc705cbac5/step-1", 0),
		envelope.ToolCallID("x/step-12", 345),
		"/step-0/call-0",
		"a/b/step-3/call-9",
	} {
		require.True(t, envelope.IsToolCallID(id), id)
	}
	for _, id := range []string{
		"m-1", "x/step-1", "x/call-1", "x/step-1/call-", "x/step-/call-1",
		"x/step-1/call-1a", "x/step-1/call-1/", "x/step1/call-1", "x/step-1call-1",
		"x/step-1/Call-1", "x/step-1/call--1", "step-1/call-1",
	} {
		require.False(t, envelope.IsToolCallID(id), id)
	}
}
