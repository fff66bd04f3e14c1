package recovery_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// TestInfiniteExpiryDoesNotStopThePass: a claim whose expires_at is
// '-infinity' (a hand edit, a restore, a repair script: the column admits
// it) fails no scan: the pass decides the healthy claims behind it,
// redrives the lost wakes and reports the quarantine gauge (invariant 10).
func TestInfiniteExpiryDoesNotStopThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// A healthy expired claim with a waiting prompt.
	b.admit(t, "s", "m1", "hello")
	b.acquire(t, "s", "exec-s")
	b.die(t, "s")
	// A lost wake: a waiting prompt, no claim, old enough to redrive, and
	// its admission's wake gone.
	b.admit(t, "lw", "m2", "hi")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE message_id = 'm2'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes' AND key = 'lw'`)
	// The poison row.
	b.exec(t, `INSERT INTO sessions (session_id) VALUES ('poison')`)
	b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ('poison', 'poison-exec', 'dead', 1, 'ready', '-infinity')`)

	var reported int
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute,
		OnQuarantinedFunc: func(map[string]int) { reported++ }})
	for pass := 1; pass <= 2; pass++ {
		p, err := rec.RunOnce(ctx)
		t.Logf("pass %d: %+v, err: %v", pass, p, err)
		require.NoError(t, err, "one odd row fails the whole pass")
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's'`), "the healthy claim behind the poison row was decided")
	require.Equal(t, 1, b.wakes(t, "lw"), "the lost wake was redriven")
	require.Equal(t, 2, reported, "the quarantine gauge was reported")
}

// A claim whose expires_at is not a time is quarantined with its reason,
// '-infinity' (expired before any clock) and 'infinity' (a lease that never
// ends, which would hold its session for good) alike: the gauge shows it, a
// release before the repair is refused naming the reason, and once an
// operator sets a time and releases it the next pass decides it as any
// expired claim.
func TestInfiniteExpiryQuarantinedThenReleased(t *testing.T) {
	t.Parallel()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			b.admit(t, "s", "m1", "hello")
			b.acquire(t, "s", "exec-s")
			b.exec(t, `UPDATE claims SET expires_at = $1::timestamptz WHERE session_id = 's'`, value)
			reason := recovery.ReasonExpiryNotFinite + " (" + value + ")"

			plan, err := b.rec.Plan(ctx, nil)
			require.NoError(t, err)
			require.Len(t, plan.Claims, 1)
			require.Equal(t, recovery.DecisionQuarantined, plan.Claims[0].Decision.Decision)
			require.Equal(t, reason, plan.Claims[0].QuarantineReason)
			var out strings.Builder
			recovery.WritePlan(&out, plan)
			require.Contains(t, out.String(), "expired at "+value)

			_, err = recovery.Resolve(ctx, b.pool, "s", "none", &recovery.ResolveOpts{Finding: recovery.FindingDidNotRun, Operator: "op"})
			require.ErrorIs(t, err, recovery.ErrSessionBusy, "a resolution reads the claim and refuses")
			require.ErrorContains(t, err, "lease until "+value+"): its lease is not a time")

			var counts map[string]int
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour,
				OnQuarantinedFunc: func(c map[string]int) { counts = c }})
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, p.Decisions)
			require.Equal(t, 1, counts[recovery.KindClaim], "the gauge shows it")
			rows, err := recovery.ListQuarantined(ctx, b.pool)
			require.NoError(t, err)
			require.Len(t, rows, 1)
			require.Equal(t, reason, rows[0].Reason)
			recs := b.records(t, "s")
			require.Len(t, recs, 1)
			require.Equal(t, value, recs[0].Evidence.ExpiredAtNotFinite)
			var explained strings.Builder
			recovery.Explain(&explained, recs)
			require.Contains(t, explained.String(), "expired at "+value)

			err = recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op"})
			require.ErrorIs(t, err, recovery.ErrStillInvalid)
			require.ErrorContains(t, err, reason)
			require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases`), "nothing released, nothing audited")

			// The repair: a time. Then the release, and the next pass.
			b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = 's'`)
			require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op"}))
			wakes := b.wakes(t, "s")
			p, err = rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, p.Decisions)
			require.Zero(t, counts[recovery.KindClaim])
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
			require.Equal(t, wakes+1, b.wakes(t, "s"), "the waiting prompt is woken")
		})
	}
}

// Plan, Waiting, a held pass and Apply page through claims whose expiry is
// not a time (one claim a page), in the pass's order, and Apply quarantines
// them by compare-and-swap on the value it planned on.
func TestInfiniteExpiryPlannedAndApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for _, s := range []string{"a", "b", "c", "d"} {
		b.admit(t, s, "m-"+s, "hello")
		b.acquire(t, s, "exec-"+s)
	}
	b.exec(t, `UPDATE claims SET expires_at = '-infinity' WHERE session_id IN ('a', 'b')`)
	b.die(t, "c")
	b.exec(t, `UPDATE claims SET expires_at = 'infinity' WHERE session_id = 'd'`)
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 1, RedriveAfter: time.Hour})

	plan, err := rec.Plan(ctx, &recovery.PlanOpts{All: true})
	require.NoError(t, err)
	var order []string
	for _, c := range plan.Claims {
		order = append(order, c.SessionID+":"+string(c.Decision.Decision))
	}
	require.Equal(t, []string{"a:quarantined", "b:quarantined", "c:rewoken", "d:quarantined"}, order)
	want := map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 3, recovery.DecisionRewoken: 1}
	waiting, err := rec.Waiting(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, want, waiting)

	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "op", ""))
	var held map[recovery.DecisionKind]int
	holder := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 1, RedriveAfter: time.Hour,
		OnHeldFunc: func(c map[recovery.DecisionKind]int) { held = c }})
	_, err = holder.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, want, held)

	applied, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "op", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, want, applied.Decisions)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason LIKE $1`, recovery.ReasonExpiryNotFinite+"%"))
}

// A waiting input whose admitted_at is '-infinity' fails no plan: it is the
// oldest lost wake (its oldest admission shown as not a time), and Apply
// wakes its session again.
func TestInfiniteAdmissionPlannedAndApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "lw", "m1", "hi")
	b.exec(t, `UPDATE inputs SET admitted_at = '-infinity' WHERE message_id = 'm1'`)
	b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes' AND key = 'lw'`)
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})

	plan, err := rec.Plan(ctx, nil)
	require.NoError(t, err, "one odd input fails the plan")
	require.Len(t, plan.LostWakes, 1)
	require.Equal(t, "lw", plan.LostWakes[0].SessionID)
	require.True(t, plan.LostWakes[0].OldestWaiting.IsZero())
	var out strings.Builder
	recovery.WritePlan(&out, plan)
	require.Contains(t, out.String(), "the oldest admitted at -infinity")

	applied, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "op", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRedriven: 1}, applied.Decisions)
	require.Equal(t, 1, b.wakes(t, "lw"))
}

// A scan of expired claims that fails (here: a column it reads is gone)
// holds back neither the lost-wake redrive nor the quarantine gauge of the
// same pass, in auto or in hold; the pass returns its error.
func TestFailingClaimScanDoesNotStopThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []string{recovery.ModeAuto, recovery.ModeHold} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.admit(t, "lw", "m1", "hi")
			b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE message_id = 'm1'`)
			b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes' AND key = 'lw'`)
			b.exec(t, `ALTER TABLE claims RENAME COLUMN phase TO phase_gone`)
			var reported int
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Mode: mode,
				OnQuarantinedFunc: func(map[string]int) { reported++ }})
			p, err := rec.RunOnce(ctx)
			require.ErrorContains(t, err, "phase", "the scan's failure is the pass's")
			require.Equal(t, 1, reported, "the quarantine gauge was reported")
			if mode == recovery.ModeAuto {
				require.Equal(t, 1, p.Redriven)
				require.Equal(t, 1, b.wakes(t, "lw"), "the lost wake was redriven")
			}
		})
	}
}

// A paced pass whose bucket cannot be read (here: its table is gone) ends
// with that error and still reports the quarantine gauge, as a failing
// claim scan does: the alert must not go dark with the pass.
func TestFailingBucketStillReportsTheQuarantined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `ALTER TABLE recovery_rate RENAME TO recovery_rate_gone`)
	var reported []map[string]int
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute, Rate: 10,
		OnQuarantinedFunc: func(counts map[string]int) { reported = append(reported, counts) }})
	_, err := rec.RunOnce(ctx)
	require.ErrorContains(t, err, "checking the recovery bucket")
	require.Equal(t, []map[string]int{{recovery.KindClaim: 0, recovery.KindInput: 0, recovery.KindOutbox: 0}}, reported,
		"the quarantine gauge was reported")
}
