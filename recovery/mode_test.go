package recovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

func TestHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AHeldPassTakesNothingOverAndCountsWhatWaits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		var held []map[recovery.DecisionKind]int
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Mode: recovery.ModeHold,
			OnHeldFunc: func(c map[recovery.DecisionKind]int) { held = append(held, c) }})
		before := b.fingerprint(t)
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Empty(t, p.Decisions)
		require.Zero(t, p.Redriven)
		want := map[recovery.DecisionKind]int{recovery.DecisionContinued: 1, recovery.DecisionReconciled: 1, recovery.DecisionRewoken: 1,
			recovery.DecisionQuarantined: 2, recovery.DecisionRedriven: 1}
		require.Equal(t, want, p.Held)
		require.Equal(t, []map[recovery.DecisionKind]int{want}, held)
		require.Equal(t, before, b.fingerprint(t), "a held pass wrote")

		// Resume: the row wins over the flag; the next pass decides.
		require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeAuto, "ops", "all clear"))
		p, err = rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, p.Decisions[recovery.DecisionContinued]+p.Decisions[recovery.DecisionReconciled]+
			p.Decisions[recovery.DecisionRewoken]+p.Decisions[recovery.DecisionQuarantined])
		require.Equal(t, 1, p.Redriven)
		require.Equal(t, map[recovery.DecisionKind]int{}, held[len(held)-1], "nothing is held in auto")
	})

	t.Run("AQuietDatabaseHoldsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Mode: recovery.ModeHold})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, map[recovery.DecisionKind]int{}, p.Held, "no decision, not decisions of zero")
		waiting, err := rec.Waiting(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, map[recovery.DecisionKind]int{}, waiting, "Waiting, likewise")
	})

	t.Run("TheHeldGaugeCountsMoreThanOneBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		// Six more expired ready claims and three more lost wakes: with a
		// batch of 2, what waits is several batches long.
		for i := range 6 {
			s := fmt.Sprintf("ready-%d", i)
			b.admit(t, s, s+"-1", "hello")
			b.acquire(t, s, "exec-"+s)
			b.die(t, s)
		}
		for i := range 3 {
			s := fmt.Sprintf("lost-%d", i)
			b.admit(t, s, s+"-1", "lost its wake")
			b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE session_id = $1`, s)
		}
		want := map[recovery.DecisionKind]int{recovery.DecisionContinued: 1, recovery.DecisionReconciled: 1, recovery.DecisionRewoken: 7,
			recovery.DecisionQuarantined: 2, recovery.DecisionRedriven: 4}
		before := b.fingerprint(t)

		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 2, RedriveAfter: time.Minute, Mode: recovery.ModeHold})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, want, p.Held, "one pass counts every page")
		p, err = rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, want, p.Held, "the next pass counts them again, not twice")

		// One page per pass: the first passes show a growing lower bound,
		// then the count of the whole scan, and each scan after it.
		rec = recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 2, HeldPages: 1, RedriveAfter: time.Minute, Mode: recovery.ModeHold})
		var claims []int
		for range 6 {
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 4, p.Held[recovery.DecisionRedriven], "lost wakes are counted whole every pass")
			claims = append(claims, sum(p.Held)-p.Held[recovery.DecisionRedriven])
		}
		require.Equal(t, []int{2, 4, 6, 8, 10, 11}, claims[:6])
		p, err = rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, want, p.Held, "a later scan keeps the last whole count while it runs")
		require.Equal(t, before, b.fingerprint(t), "a held pass wrote")
	})

	t.Run("TheRowHoldsAnAutoProcess", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "bad deploy"))
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Empty(t, p.Decisions)
		require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries`))
		require.Equal(t, 5, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_actions WHERE action = 'hold' AND operator = 'ops' AND note = 'bad deploy'`))
		s, ok, err := recovery.Mode(ctx, b.pool)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, recovery.ModeHold, s.Mode)
		require.Error(t, recovery.SetMode(ctx, b.pool, "sometimes", "ops", ""))
		require.Error(t, recovery.SetMode(ctx, b.pool, recovery.ModeAuto, "", ""))
	})

	t.Run("ApplyIsFilteredBoundedAuditedAndResumable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "bad deploy"))
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})

		// One decision only.
		a, err := rec.Apply(ctx, &recovery.ApplyOpts{Decision: recovery.DecisionReconciled, Operator: "ops", Note: "checked u", Rate: 100})
		require.NoError(t, err)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, a.Decisions)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = 'u' AND decision = 'reconciled' AND recovered_by = $1`,
			"apply#"+itoa(a.ID)+":ops"))
		require.Equal(t, 4, b.count(t, `SELECT count(*) FROM claims`), "only the asked decision was applied")

		// Bounded: two now, at the rate.
		const rate = 5.0
		start := time.Now()
		a, err = rec.Apply(ctx, &recovery.ApplyOpts{Max: 2, Operator: "ops", Rate: rate})
		require.NoError(t, err)
		require.Equal(t, 2, sum(a.Decisions))
		require.GreaterOrEqual(t, time.Since(start), time.Duration(float64(time.Second)/rate), "two decisions at 5/s take a fifth of a second")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_actions WHERE id = $1 AND applied = 2 AND finished_at IS NOT NULL`, a.ID))

		// Again: only what is left (two claims, one lost wake), each once.
		a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 100})
		require.NoError(t, err)
		require.Equal(t, 3, sum(a.Decisions), "%v", a.Decisions)
		require.Equal(t, 5, b.count(t, `SELECT count(*) FROM recoveries`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NULL`))
		plan, err := rec.Plan(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, plan.Claims)
		require.Empty(t, plan.LostWakes)
		a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops"})
		require.NoError(t, err)
		require.Empty(t, a.Decisions, "nothing is left")
		_, err = rec.Apply(ctx, &recovery.ApplyOpts{})
		require.Error(t, err, "an apply names its operator")
	})
}

func sum(m map[recovery.DecisionKind]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func itoa(n int64) string { return fmt.Sprint(n) }
