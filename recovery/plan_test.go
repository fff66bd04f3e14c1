package recovery_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// planStates leaves one expired claim of each kind a pass decides, and a
// lost wake: a (continue: a settled tool step), u (unknown: an attempt
// without its response), r (ready, a prompt waiting), q (a phase no
// process writes: quarantined), c (continue, its continuation ID held by
// another session's continuation: a decision that fails, quarantined), and
// w (an input whose wake was lost, no claim).
func planStates(t *testing.T, b *testBundle) {
	t.Helper()
	b.admit(t, "a", "a1", "/tool echo {}")
	ca := b.startTurn(t, "a", "a1")
	attempt := b.beginAttempt(t, ca, 1, "scripted")
	calls := b.toolStep(t, ca, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
	b.settleCall(t, ca, calls[0], "x")

	b.admit(t, "u", "u1", "hello")
	b.admit(t, "u", "u2", "queued behind it")
	cu := b.startTurn(t, "u", "u1")
	b.beginAttempt(t, cu, 1, "scripted")

	b.admit(t, "r", "r1", "hello")
	b.acquire(t, "r", "exec-r")

	b.admit(t, "q", "q1", "hello")
	b.acquire(t, "q", "exec-q")
	b.exec(t, `UPDATE claims SET phase = 'bogus' WHERE session_id = 'q'`)

	b.admit(t, "w", "w1", "lost its wake")
	b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE session_id = 'w'`)

	b.admit(t, "c", "c1", "/tool echo {}")
	cc := b.startTurn(t, "c", "c1")
	attempt = b.beginAttempt(t, cc, 1, "scripted")
	calls = b.toolStep(t, cc, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
	b.settleCall(t, cc, calls[0], "x")
	b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, promotion_seq, kind)
		VALUES ($1, 'w', '', '\x00', 'steer', false, nextval('promotion_seq'), 'continuation')`, recovery.ContinuationID("exec-c"))

	for _, s := range []string{"a", "u", "r", "q", "c"} {
		b.die(t, s)
	}
}

// fingerprint is every row of the tables recovery reads or writes, with
// its xmin: any write (even one that changes nothing) shows.
func (b *testBundle) fingerprint(t *testing.T) string {
	t.Helper()
	var out bytes.Buffer
	for _, table := range []string{"sessions", "claims", "inputs", "messages", "message_parts", "attempts", "tool_calls", "recoveries", "outbox"} {
		var fp string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) || ':' || coalesce(md5(string_agg(t::text || '@' || t.xmin::text, ',' ORDER BY t::text)), '') FROM `+table+` t`).Scan(&fp))
		out.WriteString(table + "=" + fp + "\n")
	}
	return out.String()
}

func TestPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("WritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		before := b.fingerprint(t)
		plan, err := rec.Plan(ctx, nil)
		require.NoError(t, err)
		require.Len(t, plan.Claims, 5)
		require.Len(t, plan.LostWakes, 1)
		again, err := rec.Plan(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, before, b.fingerprint(t), "the plan wrote")
		require.Equal(t, plan.Claims, again.Claims, "a plan of unchanged state is the same plan")
	})

	t.Run("AllPlansEveryPageNotOneBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		for _, w := range []string{"w2", "w3"} {
			b.admit(t, w, w+"-1", "lost its wake too")
			b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE session_id = $1`, w)
		}
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", Batch: 2, RedriveAfter: time.Minute})
		one, err := rec.Plan(ctx, nil)
		require.NoError(t, err)
		require.Len(t, one.Claims, 2, "a pass's plan: one batch")
		require.Len(t, one.LostWakes, 2)
		before := b.fingerprint(t)
		all, err := rec.Plan(ctx, &recovery.PlanOpts{All: true})
		require.NoError(t, err)
		require.Len(t, all.Claims, 5, "every expired claim, in pages of the batch")
		require.Len(t, all.LostWakes, 3, "every lost wake")
		require.Equal(t, one.Claims, all.Claims[:2], "in the pass's order")
		seen := map[string]bool{}
		for _, c := range all.Claims {
			require.False(t, seen[c.ExecutionID], "planned twice: %s", c.ExecutionID)
			seen[c.ExecutionID] = true
		}
		waiting, err := rec.Waiting(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionContinued: 1, recovery.DecisionReconciled: 1, recovery.DecisionRewoken: 1,
			recovery.DecisionQuarantined: 2, recovery.DecisionRedriven: 3}, waiting, "Waiting counts what the whole plan lists")
		require.Equal(t, before, b.fingerprint(t), "the plan wrote")
	})

	t.Run("APassTakesThePlannedDecisions", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		plan, err := rec.Plan(ctx, nil)
		require.NoError(t, err)
		planned := map[string]recovery.Decision{}
		counts := map[recovery.DecisionKind]int{}
		for _, c := range plan.Claims {
			planned[c.SessionID] = c.Decision
			counts[c.Decision.Decision]++
		}
		require.Equal(t, map[string]recovery.DecisionKind{"a": recovery.DecisionContinued, "u": recovery.DecisionReconciled,
			"r": recovery.DecisionRewoken, "q": recovery.DecisionQuarantined, "c": recovery.DecisionQuarantined},
			map[string]recovery.DecisionKind{"a": planned["a"].Decision, "u": planned["u"].Decision, "r": planned["r"].Decision,
				"q": planned["q"].Decision, "c": planned["c"].Decision})
		require.Equal(t, recovery.ContinuationID("exec-a"), planned["a"].ContinuationID)
		require.Equal(t, []recovery.LostWake{{SessionID: "w", Decision: recovery.DecisionRedriven, WaitingInputs: 1,
			OldestWaiting: plan.LostWakes[0].OldestWaiting}}, plan.LostWakes)
		wakes := b.wakes(t, "w")

		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, counts, p.Decisions, "the pass took the planned decisions")
		require.Equal(t, len(plan.LostWakes), p.Redriven)
		require.Equal(t, wakes+1, b.wakes(t, "w"), "the planned lost wake was woken again")
		for s, d := range planned {
			recs := b.records(t, s)
			require.Len(t, recs, 1, s)
			got := recovery.Decision{Decision: recs[0].Decision, Rule: recs[0].Rule, ContinuationID: recs[0].ContinuationID,
				RetryAttemptID: recs[0].RetryAttemptID, QuarantineReason: recs[0].QuarantineReason}
			want := d
			want = recovery.Decision{Decision: want.Decision, Rule: want.Rule, ContinuationID: want.ContinuationID,
				RetryAttemptID: want.RetryAttemptID, QuarantineReason: want.QuarantineReason}
			require.Equal(t, want, got, "session %s", s)
		}
	})

	t.Run("OneSession", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		for _, s := range []string{"u", "w"} {
			plan, err := rec.Plan(ctx, &recovery.PlanOpts{SessionID: s})
			require.NoError(t, err)
			var sessions []string
			for _, c := range plan.Claims {
				sessions = append(sessions, c.SessionID)
			}
			for _, l := range plan.LostWakes {
				sessions = append(sessions, l.SessionID)
			}
			require.Equal(t, []string{s}, sessions)
		}
	})

	t.Run("WordsOfExplain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		planStates(t, b)
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})
		plan, err := rec.Plan(ctx, &recovery.PlanOpts{SessionID: "u"})
		require.NoError(t, err)
		var w bytes.Buffer
		recovery.WritePlan(&w, plan)
		require.Contains(t, w.String(), "Would decide: reconciled — a provider request or a side-effecting tool call may have been acted on")
		require.Contains(t, w.String(), "Provider attempt exec-u")
		require.Contains(t, w.String(), "Inputs waiting: 1.")
	})
}
