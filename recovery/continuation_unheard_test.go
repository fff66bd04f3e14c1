package recovery_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// docs/design.md, invariant 13: the promotion of a continuation (the
// input a recovery admitted to finish a turn whose calls were settled)
// commits the recovery's settlement, the input's promotion and the next
// step's intent in one transaction. Its commit lost unheard, the executor
// retries it under the same position: the fence finds it applied and the
// turn it built runs, one step, once. Left to recovery instead, as it was,
// the claim would expire with the intent committed, and the step would be
// reconciled as outcome unknown although it was never sent.
func TestContinuationPromotionCommittedButUnheard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
	c := b.startTurn(t, "s", "m1")
	attempt := b.beginAttempt(t, c, 1, "scripted")
	calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{"text": "hi"}`})
	b.startCall(t, c, calls[0])
	b.settleCall(t, c, calls[0], "hi")
	b.die(t, "s")
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionContinued])
	contID := recovery.ContinuationID("exec-s")

	proxy, proxied := pgproxy.StartFor(t, b.url)
	ppool, err := pgxpool.New(ctx, proxied)
	require.NoError(t, err)
	t.Cleanup(ppool.Close)
	proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "UPDATE recoveries SET settled_at") })

	rec := &recorder{}
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	claims := ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: 10 * time.Second, OwnerID: "new-process", Logger: testkit.Logger(t, nil)})
	e, err := executor.NewExecutor(ppool, &executor.ExecutorConfig{Claims: claims, Provider: rec, Tools: reg, Logger: testkit.Logger(t, nil)})
	require.NoError(t, err)
	require.NoError(t, e.Start(ctx))
	t.Cleanup(e.StopNow)
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not go idle")
	}

	require.Equal(t, 1, proxy.Stats().AmbiguousCuts, "the continuation's promotion was committed and its answer cut")
	require.Len(t, rec.all(), 1, "the continuation's step sent once")
	completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
	require.Len(t, completed, 1, "the turn completed")
	require.Equal(t, []string{"m1"}, completed[0].MessageIDs)
	require.Empty(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed), "no turn.failed")
	require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE state <> 'succeeded'`), "no attempt left unknown")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE continuation_message_id = $1 AND settled_at IS NOT NULL`, contID))
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released, not left to expire")
}
