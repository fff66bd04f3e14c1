package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/tools"
)

// TestToolCallWithNoNameFailsTheStep: a provider's answer with a tool
// call that has no name (the scripted provider's bare "/tool" line, or a
// custom provider's bug) fails the step as the provider's error. It was
// recorded and announced: step.completed with "tool": "" and
// tool.completed with no "tool" at all, both against the event schema
// that consumers validate with.
func TestToolCallWithNoNameFailsTheStep(t *testing.T) {
	t.Parallel()
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	b := setup(t, setupOpts{tools: reg})
	sess, msg := id(t, "s"), id(t, "m")
	b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "/tool"})
	done := b.waitTurn(t, msg)
	require.Equal(t, envelope.EventTurnFailed, done.Type)
	require.Equal(t, envelope.FailProviderError, done.Reason)
	require.Contains(t, done.Error, "with no name")
	require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls`), "no call recorded")

	schema := testkit.EventSchema(t)
	require.Eventually(t, func() bool { return len(b.events.All()) >= 3 }, 20*time.Second, 10*time.Millisecond)
	for _, m := range b.events.All() {
		testkit.RequireValid(t, schema, m.Value)
	}
}
