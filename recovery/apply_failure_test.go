package recovery_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// An apply whose decision fails deterministically quarantines the claim,
// as a pass does (TestApplyGoesOnPastAFailedDecision), and what becomes of
// that quarantine is counted apart: the claim changed meanwhile (skipped)
// or a transient error (retried) and the run goes on; any other error ends
// the run. r1's decision fails on the decision recorded before for its
// execution; a trigger on claims stands for what happens to the
// quarantine's own UPDATE (TestRecoveryPassAfterAFailedDecision).
func TestApplyAfterAFailedDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		trigger          string
		skipped, retried int
		err              string
	}{
		"ClaimChanged":       {trigger: `RETURN NULL;`, skipped: 1},
		"TransientError":     {trigger: `RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001';`, retried: 1},
		"DeterministicError": {trigger: `RAISE EXCEPTION 'refused';`, err: "quarantining r1 after a failed decision"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for i, s := range []string{"r1", "r2"} {
				b.admit(t, s, s+"m", "hello")
				b.acquire(t, s, "exec-"+s)
				b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
			}
			b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by)
				VALUES ('exec-r1', 'r1', 'ready', 'rewoken', '{}', 1, 2, 'earlier')`)
			b.exec(t, `CREATE FUNCTION quarantine_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+tc.trigger+` END $$`)
			b.exec(t, `CREATE TRIGGER quarantine_fault BEFORE UPDATE ON claims FOR EACH ROW
				WHEN (OLD.quarantine_reason IS NULL AND NEW.quarantine_reason IS NOT NULL) EXECUTE FUNCTION quarantine_fault()`)
			require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
			var transient atomic.Int32
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, OnTransientErrorFunc: func() { transient.Add(1) }})

			a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
			require.Equal(t, 1, a.Failed)
			require.Equal(t, tc.skipped, a.Skipped)
			require.Equal(t, tc.retried, a.Retried)
			require.Equal(t, tc.retried, int(transient.Load()))
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND quarantine_reason IS NOT NULL`), "r1 is left as it was")
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.Empty(t, a.Decisions, "the run ended at r1")
				return
			}
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, a.Decisions, "the run went on to r2")
		})
	}
}

// A transient error while an apply wakes a session again leaves that
// session for a later run (invariant 13), and the run goes on to the next
// lost wake. A trigger fails the redrive of w1 only.
func TestApplyLeavesALostWakeAfterATransientError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i, s := range []string{"w1", "w2"} {
		b.admit(t, s, s+"m", "lost its wake")
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
	}
	b.exec(t, `CREATE FUNCTION redrive_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
		RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END $$`)
	b.exec(t, `CREATE TRIGGER redrive_fault BEFORE UPDATE ON sessions FOR EACH ROW
		WHEN (NEW.session_id = 'w1' AND NEW.redriven_at IS DISTINCT FROM OLD.redriven_at) EXECUTE FUNCTION redrive_fault()`)
	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	w1, w2 := b.wakes(t, "w1"), b.wakes(t, "w2") // their admissions' wakes
	var transient atomic.Int32
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, OnTransientErrorFunc: func() { transient.Add(1) }})

	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err, "a transient error does not end the run")
	require.Equal(t, 1, a.Retried)
	require.Equal(t, int32(1), transient.Load())
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRedriven: 1}, a.Decisions, "w2 is woken")
	require.Equal(t, w2+1, b.wakes(t, "w2"))
	require.Equal(t, w1, b.wakes(t, "w1"), "w1 is left for a later run")
}

// A lost wake that another process woke after the apply's plan (a pass
// of the fleet) is skipped, not woken twice nor counted as woken.
func TestApplySkipsALostWakeWokenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i, s := range []string{"w1", "w2"} {
		b.admit(t, s, s+"m", "lost its wake")
		b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
	}
	w2 := b.wakes(t, "w2")
	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000, OnProgressFunc: func(_ int, what string) {
		if what == "w1: "+string(recovery.DecisionRedriven) {
			b.exec(t, `UPDATE sessions SET redriven_at = now() WHERE session_id = 'w2'`) // woken by another process
		}
	}})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRedriven: 1}, a.Decisions)
	require.Equal(t, 1, a.Skipped)
	require.Equal(t, w2, b.wakes(t, "w2"), "not woken by the apply")
}
