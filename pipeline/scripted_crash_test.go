//go:build !faults

package pipeline_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/pipeline"
)

// /crash kills the process only in a faults build; elsewhere a prompt
// that says it is ordinary text, echoed.
func TestScriptedProviderCrashIsTextWithoutFaults(t *testing.T) {
	t.Parallel()
	resp, err := pipeline.ScriptedProvider{}.Complete(t.Context(), pipeline.ProviderRequest{
		Turn: []pipeline.TranscriptMessage{{Role: "user", Text: "/crash"}}})
	require.NoError(t, err)
	require.Equal(t, "echo: /crash", resp.Text)
}
