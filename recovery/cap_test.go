package recovery_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// A session whose turn is run again by recovery MaxPerSession times within
// the window is quarantined with reason recovery_cap instead of being run
// once more; the count comes from the recoveries table (it survives a
// restart: a new Recoverer counts the same), the plan shows the same
// decision, and a release lets the session run again, counting afresh
// from the release.
func TestRecoveryCapPerSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setupCapped := func(t *testing.T) (*testBundle, func() *recovery.Recoverer) {
		b := setup(t)
		newRec := func() *recovery.Recoverer {
			return recovery.New(b.pool, &recovery.Config{Batch: 100, OwnerID: "recovery-test", RedriveAfter: time.Hour,
				MaxPerSession: 2, MaxPerSessionWindow: time.Hour})
		}
		b.rec = newRec()
		b.admit(t, "s", "m1", "hello")
		return b, newRec
	}
	// crash acquires the session's claim for a new execution in phase
	// ready and leaves it as a killed process does.
	n := 0
	crash := func(t *testing.T, b *testBundle) {
		t.Helper()
		n++
		x := b.acquire(t, "s", fmt.Sprintf("exec-%d", n))
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.SetPhase(ctx, tx, ledger.PhaseReady, "") }))
		b.die(t, "s")
	}

	t.Run("QuarantinedAtTheCap", func(t *testing.T) {
		b, newRec := setupCapped(t)
		for range 2 {
			crash(t, b)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		}
		crash(t, b)

		// A restarted process counts from the database, and its plan
		// shows what its pass does.
		b.rec = newRec()
		plan, err := b.rec.Plan(ctx, nil)
		require.NoError(t, err)
		require.Len(t, plan.Claims, 1)
		require.Equal(t, recovery.DecisionQuarantined, plan.Claims[0].Decision.Decision)
		require.True(t, strings.HasPrefix(plan.Claims[0].QuarantineReason, recovery.ReasonRecoveryCap+":"), plan.Claims[0].QuarantineReason)
		require.Equal(t, &recovery.CapFact{Max: 2, Window: "1h0m0s", Recovered: 2}, plan.Claims[0].Evidence.Cap)
		var words strings.Builder
		recovery.WritePlan(&words, plan)
		require.Contains(t, words.String(), "reached its recovery cap")
		require.Contains(t, words.String(), "Recoveries that ran the session's turn again within 1h0m0s: 2 (cap 2).")

		wakes := b.wakes(t, "s")
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, b.pass(t).Decisions)
		require.Equal(t, wakes, b.wakes(t, "s"), "capped: no wake")
		reason := ""
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT quarantine_reason FROM claims WHERE session_id = 's'`).Scan(&reason))
		require.True(t, strings.HasPrefix(reason, recovery.ReasonRecoveryCap+":"), reason)
		require.Empty(t, b.pass(t).Decisions, "a quarantined claim is skipped by later passes")
		decided := testkit.SessionEvents(t, b.pool, "s", envelope.EventRecoveryDecided)
		require.Len(t, decided, 3, "two rewoken, then the quarantine")
		quarantined := decided[2]
		require.Equal(t, string(recovery.DecisionQuarantined), quarantined.Decision, "watchers learn that the session waits for an operator")
		require.Equal(t, "exec-3", quarantined.ExecutionID)
		recs := b.records(t, "s")
		capped := recs[len(recs)-1]
		require.Equal(t, recovery.DecisionQuarantined, capped.Decision)
		require.Equal(t, &recovery.CapFact{Max: 2, Window: "1h0m0s", Recovered: 2}, capped.Evidence.Cap, "stored with its evidence")
		words.Reset()
		recovery.Explain(&words, recs)
		require.Contains(t, words.String(), "Decision: quarantined — the session reached its recovery cap")
		require.Contains(t, words.String(), "Recoveries that ran the session's turn again within 1h0m0s: 2 (cap 2).")

		// Released: the session runs again, and the cap counts from the
		// release, so the next crash is recovered, and the cap is reached
		// again only after two more.
		require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op", Note: "looked"}))
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions, "the released claim is recovered")
		decided = testkit.SessionEvents(t, b.pool, "s", envelope.EventRecoveryDecided)
		require.Len(t, decided, 4)
		require.Equal(t, "exec-3", decided[3].ExecutionID)
		require.Equal(t, string(recovery.DecisionRewoken), decided[3].Decision)
		require.NotEqual(t, quarantined.ID, decided[3].ID, "one execution's quarantine and its later decision are two events: a consumer that deduplicates on id keeps both")
		crash(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		crash(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, b.pass(t).Decisions, "two since the release: capped again")
		decided = testkit.SessionEvents(t, b.pool, "s", envelope.EventRecoveryDecided)
		ids := map[string]bool{}
		for _, e := range decided {
			require.False(t, ids[e.ID], "event id %s written twice", e.ID)
			ids[e.ID] = true
		}
		require.Equal(t, string(recovery.DecisionQuarantined), decided[len(decided)-1].Decision)
	})

	t.Run("OutsideTheWindowNotCounted", func(t *testing.T) {
		b, _ := setupCapped(t)
		for range 2 {
			crash(t, b)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		}
		b.exec(t, `UPDATE recoveries SET decided_at = decided_at - interval '61 minutes'`)
		crash(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
	})

	// A step answered (or a turn ended) since a recovery proves the
	// session was not looping: recoveries before it do not count. Without
	// this, five lease expiries of healthy sessions in an hour (a database
	// stall, a paused process, a fleet-wide crash) would quarantine them.
	t.Run("ProgressStartsTheCountAfresh", func(t *testing.T) {
		b, _ := setupCapped(t)
		for range 2 {
			crash(t, b)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		}
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, completed_at)
			VALUES ('answered', 's', 'assistant', 'completed', now())`)
		for range 2 {
			crash(t, b)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions, "progress since: counted afresh")
		}
		crash(t, b)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, b.pass(t).Decisions, "two without progress since: capped")
	})

	t.Run("NoCapByDefault", func(t *testing.T) {
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		for range 4 {
			crash(t, b)
			require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		}
		recs := b.records(t, "s")
		require.Len(t, recs, 4)
		for _, r := range recs {
			require.Nil(t, r.Evidence.Cap, "no cap: no count is read, and none is stored with the evidence")
		}
	})
}
