package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
)

// TestStuckToolDoesNotOutliveTheGrace: a tool call blocks for good,
// ignoring its context (the tool.stall fault point: a call stuck in a
// system call, as append_line was in open(2) on a FIFO), and its own
// deadline is far away. SIGTERM must still stop the process within the
// shutdown grace plus a margin, cleanly, and the call is left unknown,
// never failed or run again.
func TestStuckToolDoesNotOutliveTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-tool-stall"
	const grace = 2 * time.Second
	first := prompt(session, `/tool append_line {"file":"log.txt","line":"stuck"}`)

	p := b.start(t, "consumer-1", faults.ToolStall, "--shutdown-grace", grace.String(), "--tool-timeout", "1h",
		"--sandbox-dir", t.TempDir())
	b.send(t, first)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'started'`, session) == 1
	}, 60*time.Second, 50*time.Millisecond, "the call never started")

	start := time.Now()
	st := p.stop(t)
	took := time.Since(start)
	require.True(t, st.Success(), "SIGTERM should stop the consumer cleanly, it ended with %s", st)
	require.Less(t, took, grace+10*time.Second, "the stop waited for the stuck tool")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'unknown'`, session),
		"the abandoned call is unknown")
}

// TestToolTimeoutFlag: with --tool-timeout, a call that never returns is
// abandoned at the deadline, recorded unknown, and the turn goes on: the
// model gets the unknown outcome and answers.
func TestToolTimeoutFlag(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-tool-timeout"
	first := prompt(session, `/tool append_line {"file":"log.txt","line":"late"}`)
	b.start(t, "consumer-1", faults.ToolStall, "--tool-timeout", "500ms", "--sandbox-dir", t.TempDir())
	b.send(t, first)
	done := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, done.Type, "%+v", done)
	require.Contains(t, done.Text, "outcome unknown: exceeded the tool timeout (500ms)")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'unknown'`, session))
}
