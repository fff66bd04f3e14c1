package envelope_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

func TestIsToolCallID(t *testing.T) {
	t.Parallel()
	const exec = "01a252ff-00c9-77d7-83c4-f0dc705cbac5"
	for _, id := range []string{
		envelope.ToolCallID(exec+"/step-1", 0),
		envelope.ToolCallID(exec+"/step-12", 345),
		exec + "/step-0/call-0",
	} {
		require.True(t, envelope.IsToolCallID(id), id)
	}
	for _, id := range []string{
		"m-1", exec + "/step-1", exec + "/call-1", exec + "/step-1/call-", exec + "/step-/call-1",
		exec + "/step-1/call-1a", exec + "/step-1/call-1/", exec + "/step1/call-1", exec + "/step-1call-1",
		exec + "/step-1/Call-1", exec + "/step-1/call--1", "step-1/call-1", "/step-0/call-0",
		// Not an execution's: a prompt may hold these.
		"job-7/step-2/call-1", "a/b/step-3/call-9", "permission-reply-" + exec + "/step-1/call-0",
		"{" + exec[:34] + "}/step-1/call-0", "urn:uuid:" + exec + "/step-1/call-0",
	} {
		require.False(t, envelope.IsToolCallID(id), id)
	}
}
