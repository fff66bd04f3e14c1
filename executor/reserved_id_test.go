package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/tools"
)

// gateTool is an idempotent tool that tells when it runs and returns when
// the test opens its gate.
type gateTool struct{ started, gate chan struct{} }

func (g *gateTool) Spec() tools.Spec {
	return tools.Spec{Name: "gate", Description: "waits for the test", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.Idempotent}
}

func (g *gateTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	g.started <- struct{}{}
	select {
	case <-g.gate:
		return tools.Result{Output: "opened"}, nil
	case <-ctx.Done():
		return tools.Result{}, ctx.Err()
	}
}

// TestPromptCannotTakeAToolResultsID: a tool call's ID (tool.started's
// call_id) is the ID of the message its result is written as, once the
// tool returns. A prompt that names it while the tool runs found no
// message of that ID, so admission took it; its user message then
// collided with the tool's result when its turn was claimed, and every
// later claim of the session failed on messages' key: the session was
// wedged for good by one prompt. The form of a call's ID is promptline's
// own, and a prompt that takes it is a conflict whether the result is
// written yet or not.
func TestPromptCannotTakeAToolResultsID(t *testing.T) {
	t.Parallel()
	gate := &gateTool{started: make(chan struct{}, 1), gate: make(chan struct{})}
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(gate))
	b := setup(t, setupOpts{tools: reg})
	ctx := context.Background()
	sess, m1, m3 := id(t, "s"), id(t, "m1"), id(t, "m3")

	b.send(t, envelope.Prompt{MessageID: m1, SessionID: sess, Text: "/tool gate {}\n/reply done"})
	select {
	case <-gate.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the tool did not start")
	}
	var callID string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT call_id FROM tool_calls`).Scan(&callID))
	require.True(t, envelope.IsToolCallID(callID), "%s has the form of a call's ID", callID)

	// The hostile prompt, while the tool runs: its ID is the call's, which
	// no message holds yet.
	b.send(t, envelope.Prompt{MessageID: callID, SessionID: sess, Text: "mine now"})
	require.Eventually(t, func() bool {
		return len(b.rejects.All()) == 1 || b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, callID) == 1
	}, 20*time.Second, 10*time.Millisecond, "the prompt is decided")
	close(gate.gate)
	require.Equal(t, envelope.EventTurnCompleted, b.waitTurn(t, m1).Type)

	// The session goes on.
	b.send(t, envelope.Prompt{MessageID: m3, SessionID: sess, Text: "/reply after"})
	require.Equal(t, envelope.EventTurnCompleted, b.waitTurn(t, m3).Type, "the session is not wedged")

	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, callID), "not admitted")
	require.Len(t, b.rejects.All(), 1)
	r := b.rejects.All()[0]
	require.Equal(t, envelope.ReasonConflict, testkit.Header(r, "reason"))
	require.Equal(t, sess, string(r.Key))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND role = 'tool'`, callID), "the tool's result holds its ID")
}
