package transcript

import (
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// The reads that join a message's parts look them up by message, through
// message_parts_pkey, under skewed statistics. Planned as a join, under
// statistics that said a session's messages and a message's parts were
// many, the transcript read hashed the whole of message_parts for a
// transcript of three messages: in one burn-down of tool turns, 1,599
// logged plans scanned the table, up to 68,000 parts and 220 ms a read.
// Each of the three statements, as a join, fails here.
func TestPartsAreLookedUpByMessageUnderSkewedStatistics(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	// 5,000 sessions of four messages, each of three parts.
	pc.Exec(`ALTER TABLE messages SET (autovacuum_enabled = false)`)
	pc.Exec(`ALTER TABLE message_parts SET (autovacuum_enabled = false)`)
	pc.Exec(`INSERT INTO sessions (session_id) SELECT 's' || g FROM generate_series(1, 5000) g`)
	pc.Exec(`INSERT INTO messages (message_id, session_id, role, status)
		SELECT 'm' || g, 's' || (g % 5000 + 1), 'user', 'completed' FROM generate_series(1, 20000) g`)
	pc.Exec(`INSERT INTO message_parts (message_id, idx, kind, body)
		SELECT 'm' || g, i, 'text', 'x' FROM generate_series(1, 20000) g, generate_series(0, 2) i`)
	pc.RequirePartsLookedUp(map[string][2]string{
		"historySQL":       {historySQL, `('s42')`},
		"toolCallPartsSQL": {toolCallPartsSQL, `('s42')`},
		"turnInputsSQL":    {turnInputsSQL, `(ARRAY['m42', 'm43'])`},
	})
}
