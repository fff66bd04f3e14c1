package inspect

import (
	"testing"

	"github.com/promptline/promptline/internal/testkit"
)

// The operator's transcript looks each message's parts up by message,
// whatever the statistics say (testkit's RequirePartsLookedUp).
func TestTranscriptPartsAreLookedUpByMessage(t *testing.T) {
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
	pc.RequirePartsLookedUp(map[string][2]string{"transcriptSQL": {transcriptSQL, `('s42')`}})
}
