package recovery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// A prompt may carry any message ID, a continuation's included (docs/design.md,
// invariant 14): the continuation then takes the ID no prompt can hold,
// runs once, and the prompt runs as the prompt it is.
func TestContinuationWhoseIDAPromptHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.admit(t, "s", "m1", "/tool echo {\"text\": \"hi\"}")
	c := b.startTurn(t, "s", "m1")
	attempt := b.beginAttempt(t, c, 1, "scripted")
	calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{"text": "hi"}`})
	b.startCall(t, c, calls[0])
	b.settleCall(t, c, calls[0], "hi") // phase continue
	b.admit(t, "s", recovery.ContinuationID("exec-s"), "a prompt named like the continuation")
	b.die(t, "s")

	p := b.pass(t)
	require.Equal(t, 1, p.Decisions[recovery.DecisionContinued])
	taken := recovery.ContinuationTakenID("exec-s")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = 'exec-s' AND continuation_message_id = $1`, taken))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND kind = 'continuation' AND wake_pending`, taken))
	require.Empty(t, b.pass(t).Decisions, "a second pass finds nothing to do")

	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	b.run(t, &recorder{}, reg, "s")
	completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
	require.Len(t, completed, 2)
	require.Equal(t, []string{"m1"}, completed[0].MessageIDs, "the continuation answers the original prompt")
	require.Equal(t, []string{recovery.ContinuationID("exec-s")}, completed[1].MessageIDs, "the prompt ran as a prompt")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE continuation_message_id = $1 AND settled_at IS NOT NULL`, taken))
}
