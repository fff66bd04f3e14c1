package recovery_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
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
		b.acquire(t, s, "exec-"+s)
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
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, a.Decisions, "the reconciled claim behind two batches of rewoken ones")

	a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 3}, a.Decisions)
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}

// A prompt of another session admitted with the continuation's ID between
// the pass's gather and its insert (message IDs are the senders' to
// choose, and another session's admission does not wait for this
// session's lock) must not change the decision: as before decisions were
// made a pure function, the continuation takes the other ID and the claim
// is continued, not quarantined.
func TestContinuationIDTakenByAPromptWhileDeciding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "a", "a1", "/tool echo {}")
	ca := b.startTurn(t, "a", "a1")
	attempt := b.beginAttempt(t, ca, 1, "scripted")
	calls := b.toolStep(t, ca, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
	b.settleCall(t, ca, calls[0], "x")
	b.die(t, "a")
	b.admit(t, "x", "x1", "another session")

	// The prompt's admission, not yet committed: the pass's gather cannot
	// see it, its insert waits on it.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
		VALUES ($1, 'x', 'hi', '\x01', 'queue', true, 'prompt')`, recovery.ContinuationID("exec-a"))
	require.NoError(t, err)

	type result struct {
		p   recovery.Pass
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := b.rec.RunOnce(ctx)
		done <- result{p, err}
	}()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO inputs%'`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the pass's continuation insert waits on the prompt's")
	require.NoError(t, tx.Commit(ctx))
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pass did not finish")
	}
	require.NoError(t, res.err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionContinued: 1}, res.p.Decisions)
	recs := b.records(t, "a")
	require.Len(t, recs, 1)
	require.Equal(t, recovery.ContinuationTakenID("exec-a"), recs[0].ContinuationID)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND session_id = 'a' AND kind = 'continuation'`,
		recovery.ContinuationTakenID("exec-a")))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND session_id = 'x' AND kind = 'prompt'`,
		recovery.ContinuationID("exec-a")))
}

// A transient database error while applying one claim says nothing about
// the claim (invariant 13): the apply leaves it as it was, goes on with the
// rest, and reports it; a later run applies it.
func TestApplyLeavesAClaimAfterATransientError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for _, s := range []string{"r0", "r1", "r2"} {
		b.admit(t, s, s+"m", "hello")
		b.acquire(t, s, "exec-"+s)
		b.die(t, s)
	}
	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	release := b.holdSession(t, "r1")
	rec := recovery.New(b.poolWith(t, map[string]string{"lock_timeout": "200ms"}), &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour})
	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err, "a transient error does not end the run")
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 2}, a.Decisions)
	require.Equal(t, 1, a.Retried)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND quarantine_reason IS NULL`), "left as it was")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = 'r1'`))

	release()
	a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, a.Decisions)
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
}

// apply --decision D never carries out another decision: a claim planned
// as continued whose decision, taken again under the session's lock, is no
// longer continued (its continuation's ID came to be held by another
// session's continuation: a pass would quarantine it) is left as it was.
func TestApplyDecisionIsDecidedAgainUnderTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for _, s := range []string{"a1", "a2"} {
		b.admit(t, s, s+"m", "/tool echo {}")
		c := b.startTurn(t, s, s+"m")
		attempt := b.beginAttempt(t, c, 1, "scripted")
		calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
		b.settleCall(t, c, calls[0], "x")
		b.die(t, s)
	}
	b.admit(t, "x", "x1", "another session")
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour})
	plan, err := rec.Plan(ctx, nil)
	require.NoError(t, err)
	require.Len(t, plan.Claims, 2)
	first, second := plan.Claims[0], plan.Claims[1]
	require.Equal(t, recovery.DecisionContinued, first.Decision.Decision)
	require.Equal(t, recovery.DecisionContinued, second.Decision.Decision)

	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Decision: recovery.DecisionContinued, Operator: "ops", Rate: 1000,
		OnProgressFunc: func(int, string) {
			// After the first, before the second: another session's
			// continuation takes the second's ID.
			b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, promotion_seq, kind)
				VALUES ($1, 'x', '', '\x00', 'steer', false, nextval('promotion_seq'), 'continuation') ON CONFLICT DO NOTHING`,
				recovery.ContinuationID(second.ExecutionID))
		}})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionContinued: 1}, a.Decisions)
	require.Equal(t, 1, a.Skipped)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason IS NULL`, second.SessionID),
		"left as it was, not quarantined")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, second.SessionID))
}

// A claim whose decision fails deterministically (here: its execution has
// a decision recorded already, which record refuses) does not end an
// apply, run after run: without a filter the apply quarantines it as a pass
// does ("decision failed: ..."); with --decision it is left as it was. The
// rest is applied either way.
func TestApplyGoesOnPastAFailedDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, filter := range []recovery.DecisionKind{"", recovery.DecisionRewoken} {
		t.Run("Filter="+string(filter), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for i, s := range []string{"r0", "r1", "r2"} {
				b.admit(t, s, s+"m", "hello")
				b.acquire(t, s, "exec-"+s)
				b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' + $2 * interval '1 second' WHERE session_id = $1`, s, i)
			}
			b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by)
				VALUES ('exec-r1', 'r1', 'ready', 'rewoken', '{}', 1, 2, 'earlier')`)
			require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
			rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour})
			a, err := rec.Apply(ctx, &recovery.ApplyOpts{Decision: filter, Operator: "ops", Rate: 1000})
			require.NoError(t, err, "one failed decision does not end the run")
			require.Equal(t, 1, a.Failed)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id IN ('r0', 'r2')`), "the others are applied")
			if filter == "" {
				require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 2, recovery.DecisionQuarantined: 1}, a.Decisions)
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND quarantine_reason LIKE 'decision failed: %'`))
			} else {
				require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 2}, a.Decisions)
				require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'r1' AND quarantine_reason IS NULL`), "left as it was")
			}
		})
	}
}

// An apply without a rate is paced at its default, ten decisions a
// second: three claims take at least two intervals (the first decision
// goes at once).
func TestApplyIsPacedByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	for i := range 3 {
		s := fmt.Sprintf("r%d", i)
		b.admit(t, s, s+"m", "hello")
		b.acquire(t, s, "exec-"+s)
		b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 hour' WHERE session_id = $1`, s)
	}
	var nudges atomic.Int32
	var logs testkit.LogBuffer
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, OnCommitFunc: func() { nudges.Add(1) },
		Logger: testkit.Logger(t, &logs)})
	began := time.Now()
	a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops"})
	require.NoError(t, err)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 3}, a.Decisions)
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond)
	require.Positive(t, nudges.Load(), "the relay is nudged after the apply's wakes")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_actions WHERE id = $1 AND applied = 3 AND finished_at IS NOT NULL`, a.ID),
		"the apply's end is recorded")
	require.NotContains(t, logs.String(), "level=WARN")

	// An apply that finds nothing to do nudges nothing.
	nudges.Store(0)
	a, err = rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops"})
	require.NoError(t, err)
	require.Empty(t, a.Decisions)
	require.Zero(t, nudges.Load())
}
