package recovery_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/recovery"
)

// recoveryWakes reads the session's wake rows in the outbox.
func (b *testBundle) recoveryWakes(t *testing.T, session string) []envelope.Wake {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT payload FROM outbox WHERE topic = 'wakes' AND key = $1 ORDER BY id`, session)
	require.NoError(t, err)
	payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	out := make([]envelope.Wake, len(payloads))
	for i, p := range payloads {
		require.NoError(t, json.Unmarshal(p, &out[i]))
	}
	return out
}

// Invariant 7 for recovery, checked on the outbox itself: every decision
// that clears a claim while another input waits writes the session's wake
// in the decision's transaction — reconciling an uncertain turn, clearing a
// completed one, clearing a superseded one — not only a re-wake or a
// continuation. The other tests run an executor on the session directly,
// so they would pass without that wake; this one fails if record() wakes
// only for rewoken or continued (checked: it did with that mutation).
func TestRecoveryClearingDecisionsWakeWaitingInputs(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		decision recovery.DecisionKind
		crash    func(t *testing.T, b *testBundle, c *crashed)
	}{
		{"ReconciledUnknownAttempt", recovery.DecisionReconciled, func(t *testing.T, b *testBundle, c *crashed) {
			b.beginAttempt(t, c, 1, "scripted")
		}},
		{"ReconciledSideEffectingCall", recovery.DecisionReconciled, func(t *testing.T, b *testBundle, c *crashed) {
			attempt := b.beginAttempt(t, c, 1, "scripted")
			calls := b.toolStep(t, c, attempt, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{"file": "f", "line": "x"}`})
			b.startCall(t, c, calls[0])
		}},
		{"ClearedSafe", recovery.DecisionCleared, func(t *testing.T, b *testBundle, c *crashed) {
			b.exec(t, `UPDATE messages SET status = 'completed' WHERE message_id = $1`, c.assistant)
			b.exec(t, `UPDATE claims SET phase = 'safe'`)
		}},
		{"Superseded", recovery.DecisionSuperseded, func(t *testing.T, b *testBundle, c *crashed) {
			b.exec(t, `UPDATE claims SET phase = 'continue'`)
			b.exec(t, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('newer', 's', 'assistant', 'completed')`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.admit(t, "s", "m1", "hello")
			b.admit(t, "s", "m2", "queued behind it")
			c := b.startTurn(t, "s", "m1")
			tc.crash(t, b, c)
			b.die(t, "s")
			b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`) // admission's wakes were consumed long ago

			p := b.pass(t)
			require.Equal(t, map[recovery.DecisionKind]int{tc.decision: 1}, p.Decisions)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim is cleared")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM waiting_inputs WHERE session_id = 's'`), "m2 waits")
			wakes := b.recoveryWakes(t, "s")
			require.Len(t, wakes, 1, "the decision wakes the session for the waiting input")
			require.Equal(t, "s", wakes[0].SessionID)
			require.Equal(t, "recovery", wakes[0].Reason)
			require.Zero(t, p.Redriven, "the wake is the decision's, not the redrive's")
		})
	}

	t.Run("NothingWaitsNoWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.beginAttempt(t, c, 1, "scripted")
		b.die(t, "s")
		b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Empty(t, b.recoveryWakes(t, "s"), "no input waits: no wake")
	})
}
