package recovery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// poison points the claim of session at an assistant message whose
// answers hold a NULL, a value the column admits and the decision cannot
// read (the driver cannot scan it into a string): a row only a bug or a
// hand edit leaves.
func (b *testBundle) poison(t *testing.T, session string) {
	t.Helper()
	b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, answers)
		VALUES ('asst-poison', $1, 'assistant', 'pending', ARRAY[NULL]::text[])`, session)
	b.exec(t, `UPDATE claims SET assistant_message_id = 'asst-poison' WHERE session_id = $1`, session)
}

// TestPoisonClaimIsIsolatedInHoldMode: a claim whose evidence cannot be
// read is quarantined by a pass, and the others decided (invariant 10).
// Plan, the held gauge and Apply failed their whole page at it: the
// operator could apply nothing, not even the healthy claims of that page,
// and the gauge went stale.
func TestPoisonClaimIsIsolatedInHoldMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	sessions := b.expiredReady(t, "r", 3)
	b.poison(t, sessions[0])
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Mode: recovery.ModeHold})

	_, err := rec.RunOnce(ctx)
	require.NoError(t, err, "the held pass")
	plan, err := rec.Plan(ctx, &recovery.PlanOpts{All: true})
	require.NoError(t, err)
	require.Len(t, plan.Claims, 3)
	decided := map[string]recovery.DecisionKind{}
	for _, c := range plan.Claims {
		decided[c.SessionID] = c.Decision.Decision
	}
	require.Equal(t, map[string]recovery.DecisionKind{sessions[0]: recovery.DecisionQuarantined,
		sessions[1]: recovery.DecisionRewoken, sessions[2]: recovery.DecisionRewoken}, decided)
	require.True(t, strings.HasPrefix(plan.Claims[0].QuarantineReason, "decision failed: "), plan.Claims[0].QuarantineReason)

	applied, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, 2, applied.Decisions[recovery.DecisionRewoken])
	require.Equal(t, 1, applied.Failed)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason LIKE 'decision failed: %'`, sessions[0]))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims`), "the healthy claims are decided")
}

// TestPlanReadsOnPastARefusedRead: a read of one claim's evidence that the
// server refuses aborts only that claim's savepoint; the page's other
// claims are still read and planned in the plan's transaction. The
// refusal is made with a row-level policy that divides by zero for one
// session's messages, read through a pool whose sessions scan no table
// whole (the policy would refuse a scan that passes that session's rows).
func TestPlanReadsOnPastARefusedRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	sessions := b.expiredReady(t, "r", 3)
	b.exec(t, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('asst-r0', $1, 'assistant', 'completed')`, sessions[0])
	b.exec(t, `CREATE POLICY poison ON messages USING (CASE WHEN session_id = '`+sessions[0]+`' THEN length(message_id) / 0 = 1 ELSE true END)`)
	b.exec(t, `ALTER TABLE messages ENABLE ROW LEVEL SECURITY`)
	b.exec(t, `ALTER TABLE messages FORCE ROW LEVEL SECURITY`)
	cfg, err := pgxpool.ParseConfig(b.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rec := recovery.New(pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, Mode: recovery.ModeHold})

	plan, err := rec.Plan(ctx, &recovery.PlanOpts{All: true})
	require.NoError(t, err)
	require.Len(t, plan.Claims, 3)
	for _, c := range plan.Claims {
		want := recovery.DecisionRewoken
		if c.SessionID == sessions[0] {
			want = recovery.DecisionQuarantined
			require.Contains(t, c.QuarantineReason, "division by zero")
		}
		require.Equal(t, want, c.Decision.Decision, "%s: %s", c.SessionID, c.QuarantineReason)
	}
}

// TestPoisonClaimDoesNotStopABulkRelease: a quarantined claim whose
// evidence still cannot be read is refused, as a row that still fails
// validation is, and the bulk release goes on to the claims after it.
func TestPoisonClaimDoesNotStopABulkRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sessions := b.expiredReady(t, "r", 1)
	b.poison(t, sessions[0])
	p := b.pass(t)
	require.Equal(t, 1, p.Failed)
	b.bogusClaims(t, "later-1", "later-2")
	b.exec(t, `UPDATE claims SET phase = 'safe' WHERE session_id LIKE 'later-%'`) // repaired

	var rows []recovery.BulkReleaseRow
	sum, err := recovery.ReleaseMatching(t.Context(), b.pool, &recovery.BulkReleaseOpts{Kind: recovery.KindClaim, Operator: "ops", Note: "repaired"}, collect(&rows, nil))
	require.NoError(t, err)
	require.Equal(t, 2, sum.Released)
	require.Equal(t, 1, sum.Refused)
	require.Equal(t, map[string]string{sessions[0]: "refused", "later-1": "released", "later-2": "released"}, outcomes(rows))
}
