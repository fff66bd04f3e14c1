package recovery_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// OnAttemptUnknownFunc counts exactly the attempts a decision leaves
// unknown: the started attempt sent again with its key, and, of a
// reconciled execution, its attempts in flight, never one that had
// answered (promptline_recovery_attempts_unknown_total).
func TestRecoveryCountsTheAttemptsItLeavesUnknown(t *testing.T) {
	t.Parallel()
	newBundle := func(t *testing.T, l *spendLog) *testBundle {
		b := setup(t)
		b.rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, IdempotentProviders: []string{"keyed"},
			OnAttemptUnknownFunc: l.addUnknown})
		return b
	}

	t.Run("SentAgainWithItsKey", func(t *testing.T) {
		t.Parallel()
		l := &spendLog{unknown: map[[2]string]int{}}
		b := newBundle(t, l)
		b.admit(t, "s", "m1", "hello")
		c := b.startTurn(t, "s", "m1")
		b.beginAttempt(t, c, 1, "keyed")
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
		require.Equal(t, recovery.RuleIdempotentProviderRetry, b.records(t, "s")[0].Rule)
		require.Equal(t, map[[2]string]int{{"keyed", ""}: 1}, l.unknown)
	})

	t.Run("ReconciledWithAnAnsweredAttempt", func(t *testing.T) {
		t.Parallel()
		l := &spendLog{unknown: map[[2]string]int{}}
		b := newBundle(t, l)
		b.admit(t, "s", "m1", "/tool append_line {}")
		c := b.startTurn(t, "s", "m1")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"append_line": "side_effecting"}, map[string]string{"append_line": `{}`})
		b.startCall(t, c, calls[0])
		b.die(t, "s")
		require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionReconciled])
		require.Empty(t, l.unknown, "the step's attempt had answered: only the call is unknown")
	})
}
