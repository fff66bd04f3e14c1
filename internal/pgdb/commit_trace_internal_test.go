package pgdb

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// What the crash sweep counts as a write decides which commits it kills
// at: a write taken for a read would be a boundary never swept.
func TestCommitTracerClassifiesWrites(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]bool{
		"INSERT INTO inputs (message_id) VALUES ($1)":                 true,
		"update claims set phase = $2":                                true,
		"DELETE FROM outbox WHERE id = ANY($1)":                       true,
		"WITH d AS (DELETE FROM outbox RETURNING id) SELECT count(*)": true,
		"SELECT promptline_fence($1, $2, $3, $4, $5, $6)":             true,
		"SELECT promptline_claim_as_read($1)":                         true,
		"SELECT promptline_turn_answer($1)":                           true,
		"SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE":     false,
		"SELECT id, topic, key, payload FROM outbox ORDER BY id":      false,
		"SELECT pg_try_advisory_xact_lock($1)":                        false,
		"WITH w AS (SELECT session_id FROM inputs) SELECT * FROM w":   false,
		// The session's view and a promotion's read of its waiting
		// inputs read the queue's head through a function.
		"SELECT message_id FROM promptline_waiting_head($1) h":     false,
		"SELECT promptline_waiting_head($1), promptline_fence($2)": true,
		"SELECT promptline_waiting_head_x($1)":                     true,
	} {
		require.Equal(t, want, Writes(strings.ToLower(sql)), sql)
	}
	require.Equal(t, "INSERT INTO messages", CommitLabel("SELECT promptline_fence($1)", "INSERT INTO messages"),
		"the fence opens every execution's write and labels nothing")
	require.Equal(t, "INSERT INTO outbox", CommitLabel("SELECT promptline_finish_open($1)", "INSERT INTO outbox"),
		"nor does the fence with the session's lock")
	require.Equal(t, "SELECT promptline_turn_answer($1)", CommitLabel("SELECT promptline_finish_open($1)", "SELECT promptline_turn_answer($1)"))
	require.Equal(t, "SELECT promptline_finish_open($1)", CommitLabel("SELECT promptline_finish_open($1)", "SELECT promptline_fence($1)"),
		"an opening after an opening labels nothing either")
	require.Equal(t, "INSERT INTO inputs", CommitLabel("INSERT INTO inputs", "INSERT INTO outbox"))
}
