package inspect

import (
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// The operator's transcript looks each message's parts up by message,
// whatever the statistics say (testkit's RequirePartsLookedUp).
func TestTranscriptPartsAreLookedUpByMessage(t *testing.T) {
	t.Parallel()
	testkit.NewPlanConn(t).RequirePartsLookedUp(map[string][2]string{"transcriptSQL": {transcriptSQL, `('s42')`}})
}
