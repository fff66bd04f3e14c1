//go:build !faults

package scripted_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
)

// /crash kills the process only in a faults build; elsewhere a prompt
// that says it is ordinary text, echoed.
func TestScriptedProviderCrashIsTextWithoutFaults(t *testing.T) {
	t.Parallel()
	resp, err := scripted.ScriptedProvider{}.Complete(t.Context(), provider.Request{
		Turn: []provider.TranscriptMessage{{Role: "user", Text: "/crash"}}})
	require.NoError(t, err)
	require.Equal(t, "echo: /crash", resp.Text)
}
