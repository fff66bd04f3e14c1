package recovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// An apply filtered by decision reaches every claim of that decision, not
// only those among the first --recovery-batch expired claims: claims of
// other decisions, older, must not hide the ones asked for.
func TestApplyReachesPastTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// Three ready claims (rewoken), expired first, then one unknown
	// (reconciled) that expired last.
	for i := range 3 {
		s := fmt.Sprintf("r%d", i)
		b.admit(t, s, s+"m", "hello")
		_, err := b.claims.Acquire(ctx, s, "exec-"+s, nil)
		require.NoError(t, err)
		b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
	}
	b.admit(t, "u", "u1", "hello")
	cu := b.startTurn(t, "u", "u1")
	b.beginAttempt(t, cu, 1, "scripted")
	b.die(t, "u")

	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 2, RedriveAfter: time.Hour})
	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Decision: recovery.DecisionReconciled, Operator: "ops", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, map[string]int{recovery.DecisionReconciled: 1}, a.Decisions, "the reconciled claim behind two batches of rewoken ones")

	a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, map[string]int{recovery.DecisionRewoken: 3}, a.Decisions)
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}
