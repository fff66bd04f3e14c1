package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// With the continuation's first ID held by a prompt when the pass gathers
// (the decision takes the other ID), a prompt of another session admitted
// with the other ID while the pass decides leaves no ID: the holder found
// at the insert joins those gathered (TestContinuationIDTakenByAPromptWhileDeciding),
// and the decision fails saying both are held, quarantined; neither
// prompt is touched.
func TestContinuationBothIDsTakenWhileDeciding(t *testing.T) {
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
	b.admit(t, "y", "y1", "a third session")
	b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
		VALUES ($1, 'y', 'hi', '\x02', 'queue', true, 'prompt')`, recovery.ContinuationID("exec-a"))

	// The second prompt's admission, not yet committed: the pass's gather
	// cannot see it, its insert waits on it.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
		VALUES ($1, 'x', 'hi', '\x01', 'queue', true, 'prompt')`, recovery.ContinuationTakenID("exec-a"))
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
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, res.p.Decisions)
	require.Equal(t, 1, res.p.Failed)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 'a' AND quarantine_reason = $1`,
		"decision failed: continuation input of exec-a: both IDs are held by other inputs"))
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = 'a' AND kind = 'continuation'`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = ANY($1) AND kind = 'prompt'`,
		[]string{recovery.ContinuationID("exec-a"), recovery.ContinuationTakenID("exec-a")}))
}
