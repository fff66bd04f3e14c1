package recovery_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// Each finding on each kind of target reads as what it led to: the four
// sentences are what an operator reads back of a resolution (consumer
// recovery explain), so each is pinned to its own finding and kind.
func TestExplainSaysWhatEachFindingLedTo(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for name, tc := range map[string]struct {
		kind, finding, output string
		want                  string
	}{
		"CallDidNotRun":     {kind: "tool_call", finding: recovery.FindingDidNotRun, want: "it did not run; the continuation runs it"},
		"CallRan":           {kind: "tool_call", finding: recovery.FindingRan, want: "it ran"},
		"CallRanWithOutput": {kind: "tool_call", finding: recovery.FindingRan, output: `{"ok":true}`, want: `it ran; the model is handed the output "{\"ok\":true}"`},
		"AttemptNotActedOn": {kind: "attempt", finding: recovery.FindingDidNotRun, want: "it was not acted on; the continuation sends its step again"},
		"AttemptActedOn":    {kind: "attempt", finding: recovery.FindingRan, want: "it was acted on; its answer is lost, so the turn does not go on"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := recovery.Resolution{TargetID: "e1/step-1", TargetKind: tc.kind, Finding: tc.finding, Output: tc.output,
				StateBefore: "unknown", ResolvedBy: "ops", ResolvedAt: pgdb.TimeOf(at)}
			var out bytes.Buffer
			recovery.Explain(&out, nil, r)
			// The finding closes the line: "... by ops: <finding>.".
			require.Contains(t, out.String(), " by ops: "+tc.want+".\n")
		})
	}
}
