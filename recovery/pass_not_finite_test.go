package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// notFiniteState is one expired ready claim with a waiting prompt (s, a
// rewoken decision) and one lost wake (lw): what a pass must get through
// whatever odd time it reads on the way.
func notFiniteState(t *testing.T, b *testBundle) {
	t.Helper()
	b.admit(t, "s", "m1", "hello")
	b.acquire(t, "s", "exec-s")
	b.die(t, "s")
	b.admit(t, "lw", "m2", "hi")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE message_id = 'm2'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
}

// The recovery pass reads times of its own besides the claims' and the
// inputs': the fleet's mode (set_at), the recovery bucket (updated_at) and
// the cap's count (the last release of a capped claim). A value the
// column admits that is not a time fails none of them (invariant 10): the
// mode is still obeyed, a paced pass still decides and wakes, and the cap
// still counts. Before, the mode's read failed every pass of every
// consumer before it did anything; the bucket's refill failed every paced
// decision, which quarantined each claim as "decision failed", and every
// paced redrive; the cap's read quarantined the capped session's claim.
func TestPassReadsTimesThatAreNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run("ModeSetAt/"+value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			notFiniteState(t, b)
			require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", ""))
			b.exec(t, `UPDATE recovery_mode SET set_at = $1::timestamptz`, value)
			s, ok, err := recovery.Mode(ctx, b.pool)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, recovery.ModeHold, s.Mode)
			require.Equal(t, value, s.SetAt.NotFinite)

			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1, recovery.DecisionRedriven: 1}, p.Held,
				"held, as the row says")
			require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeAuto, "ops", ""))
			b.exec(t, `UPDATE recovery_mode SET set_at = $1::timestamptz`, value)
			p, err = rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions)
			require.Equal(t, 1, p.Redriven)
		})

		t.Run("RateBucket/"+value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			notFiniteState(t, b)
			b.exec(t, `UPDATE recovery_rate SET tokens = 0, updated_at = $1::timestamptz`, value)
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Rate: 2, Interval: time.Minute})
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions, "decided, not quarantined")
			require.Equal(t, 1, p.Redriven)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_rate WHERE isfinite(updated_at)`), "the bucket's time is a time again")
		})

		t.Run("CapRelease/"+value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			notFiniteState(t, b)
			b.exec(t, `INSERT INTO quarantine_releases (kind, ref, reason, released_by, released_at)
				VALUES ('claim', 's', $1, 'ops', $2::timestamptz)`, recovery.ReasonRecoveryCap+": 2 in 1h0m0s", value)
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute,
				MaxPerSession: 2, MaxPerSessionWindow: time.Hour})
			plan, err := rec.Plan(ctx, nil)
			require.NoError(t, err)
			require.Len(t, plan.Claims, 1)
			require.Equal(t, recovery.DecisionRewoken, plan.Claims[0].Decision.Decision)
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions, "decided, not quarantined")
		})
	}

	// The cap counts recoveries by their time, since the session's last
	// progress: a time that is not a time says nothing about when, so it
	// is left out of the count. Before, two decisions at 'infinity'
	// counted for good (every release of the capped claim was capped
	// again at once), and one answer completed at 'infinity' turned the
	// cap off for the session.
	capped := func(t *testing.T, b *testBundle) recovery.Pass {
		t.Helper()
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute,
			MaxPerSession: 2, MaxPerSessionWindow: time.Hour})
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		return p
	}
	recovered := func(t *testing.T, b *testBundle, at string) {
		t.Helper()
		for _, id := range []string{"exec-1", "exec-2"} {
			b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by, decided_at)
				VALUES ($1, 's', 'ready', 'rewoken', '{}', 1, 2, 'r', `+at+`)`, id)
		}
	}
	t.Run("CapDecidedAt/infinity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		notFiniteState(t, b)
		recovered(t, b, `'infinity'`)
		p := capped(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions, "no recovery known to be within the window")
	})
	t.Run("CapCompletedAt/infinity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		notFiniteState(t, b)
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, completed_at) VALUES ('a-old', 's', 'assistant', 'completed', 'infinity')`)
		recovered(t, b, `now() - interval '1 minute'`)
		p := capped(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, p.Decisions, "the cap still holds")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE starts_with(quarantine_reason, $1)`, recovery.ReasonRecoveryCap+":"))
	})
}
