package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/inspect"
)

// TestSessionShow runs `consumer session show` as a process on the database
// a consumer process wrote: the text report and the JSON report of a
// session whose turn called a tool, and the failure for a session the
// database does not hold.
//
// It catches: a subcommand not wired into the root command, a report that
// misses a section or the prompt text, JSON that does not decode into
// inspect.Report (or whose keys drift), and an unknown session that exits 0.
func TestSessionShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-show"
	p := prompt(session, `/tool echo {"text":"hi"}`)
	b.start(t, "consumer", "")
	b.send(t, p)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	db := []string{"--database-url", b.dbURL}

	t.Run("Text", func(t *testing.T) {
		t.Parallel()
		out, stderr, code := runOnce(t, append([]string{"session", "show", session}, db...)...)
		require.Zero(t, code, "consumer session show: %s", stderr)
		for _, want := range []string{
			"session        " + session + "\n",
			"state          idle\n",
			"INPUTS (1)",
			" user " + p.MessageID + "  completed",
			"    | /tool echo {\"text\":\"hi\"}\n",
			`    tool call call-0 echo {"text":"hi"}`,
			"    | tool results: echo: hi\n",
			"CLAIM\n  no claim\n",
			"ATTEMPTS (2)",
			"TOOL CALLS (1)",
			"RECOVERIES (0)\n  none\n",
			"PERMISSION REQUESTS (0)\n  none\n",
		} {
			require.Contains(t, out, want)
		}
		require.Regexp(t, `(?m)^  \S+/call-0\s+echo\s+idempotent\s+succeeded\s`, out)
	})

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		out, stderr, code := runOnce(t, append([]string{"session", "show", session, "--json"}, db...)...)
		require.Zero(t, code, "consumer session show --json: %s", stderr)
		var r inspect.Report
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Equal(t, session, r.SessionID)
		require.Equal(t, inspect.StateIdle, r.State)
		require.Nil(t, r.Claim)
		roles := make([]string, len(r.Transcript))
		for i, m := range r.Transcript {
			roles[i] = m.Role
		}
		require.Equal(t, []string{"user", "assistant", "tool", "assistant"}, roles)
		require.Equal(t, turn.AssistantMessageID, r.Transcript[3].MessageID, "the report's answer is the event's")
		require.Equal(t, "tool results: echo: hi", r.Transcript[3].Parts[0].Text.Value)
		require.Len(t, r.Attempts, 2)
		require.Len(t, r.ToolCalls, 1)
		require.Equal(t, "succeeded", r.ToolCalls[0].State)

		var keys map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(out), &keys))
		for _, k := range []string{"session_id", "state", "fencing_token", "inputs", "transcript", "claim",
			"attempts", "tool_calls", "recoveries", "permission_requests"} {
			require.Contains(t, keys, k)
		}
	})

	t.Run("UnknownSessionFails", func(t *testing.T) {
		t.Parallel()
		out, stderr, code := runOnce(t, append([]string{"session", "show", "s-no-such-session"}, db...)...)
		require.NotZero(t, code)
		require.Empty(t, out)
		require.Contains(t, stderr, "session s-no-such-session not found")
	})
}
