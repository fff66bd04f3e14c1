package recovery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// A continued turn is announced once (turn.recovered), with the turn's
// messages and the continuation that carries it on; a decision that does
// not continue the turn announces none, nor does a continuation whose
// assistant message names no messages of a turn.
func TestRecoveryAnnouncesTheTurnItContinues(t *testing.T) {
	t.Parallel()
	// continueState leaves session s in phase continue: a step's tool
	// call answered, the next step not begun.
	continueState := func(t *testing.T, b *testBundle) *crashed {
		b.admit(t, "s", "m1", "/tool echo {}")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
		b.settleCall(t, c, calls[0], "x")
		return c
	}

	t.Run("Continued", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := continueState(t, b)
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		events := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnRecovered)
		require.Len(t, events, 1)
		e := events[0]
		require.Equal(t, "turn.recovered:exec-s", e.ID)
		require.Equal(t, c.assistant, e.TurnID)
		require.Equal(t, []string{"m1"}, e.MessageIDs)
		require.Equal(t, c.assistant, e.AssistantMessageID)
		require.Equal(t, "exec-s", e.ExecutionID)
		require.Equal(t, recovery.ContinuationID("exec-s"), e.ContinuationMessageID)
	})

	// The crashed message is a later step's (its turn began in an earlier
	// message): the continued turn keeps the turn's ID, in recovery's
	// announcement and in the events of the turn's end.
	t.Run("ContinuedFromALaterStepKeepsTheTurnsID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := continueState(t, b)
		b.exec(t, `UPDATE messages SET turn_id = 'turn-first' WHERE message_id = $1`, c.assistant)
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		recovered := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnRecovered)
		require.Len(t, recovered, 1)
		require.Equal(t, "turn-first", recovered[0].TurnID)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		b.run(t, &recorder{}, reg, "s")
		require.Len(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted), 1)
		steps := testkit.SessionEvents(t, b.pool, "s", envelope.EventStepCompleted)
		require.NotEmpty(t, steps)
		require.Equal(t, "turn-first", steps[len(steps)-1].TurnID, "the continued step is the same turn's")
		// The continuation's promotion commits its step's intent with it
		// (its calls all settled, nothing runs first): one transaction.
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs i JOIN attempts a ON a.started_at = i.promoted_at
			WHERE i.message_id = $1 AND a.session_id = 's'`, recovery.ContinuationID("exec-s")))
	})

	t.Run("ContinuedWithoutTheTurnsMessages", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := continueState(t, b)
		b.exec(t, `UPDATE messages SET answers = '{}' WHERE message_id = $1`, c.assistant)
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		require.Empty(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnRecovered))
	})

	t.Run("Reconciled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Empty(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnRecovered))
	})
}
