package transcript

import (
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// The reads that join a message's parts look them up by message, through
// message_parts_pkey, whatever the statistics say. Planned as a join,
// under statistics that said a session's messages and a message's parts
// were many, the transcript read hashed the whole of message_parts for a
// transcript of three messages: at the burn-down of tool turns, 1,599
// reads scanned up to 68,000 parts each, 220 ms a read.
func TestPartsAreLookedUpByMessageWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	testkit.NewPlanConn(t).RequirePartsLookedUp(map[string][2]string{
		"historySQL":       {historySQL, `('s42')`},
		"toolCallPartsSQL": {toolCallPartsSQL, `('s42')`},
		"turnInputsSQL":    {turnInputsSQL, `(ARRAY['m42', 'm43'])`},
	})
}
