package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
)

// spendLog records what a recoverer reports of the spend at risk.
type spendLog struct {
	mu      sync.Mutex
	unknown map[[2]string]int
	atRisk  [][]ledger.AtRisk
}

func (l *spendLog) addUnknown(provider, model string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unknown[[2]string{provider, model}]++
}

func (l *spendLog) setAtRisk(a []ledger.AtRisk) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.atRisk = append(l.atRisk, a)
}

// A reconciled attempt is counted once, by provider and model, in the
// decision's evidence with what was known of it; the tokens at risk are
// read from the database every pass, and a second pass counts nothing
// more.
func TestSpendAtRisk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	l := &spendLog{unknown: map[[2]string]int{}}
	rec := recovery.New(b.pool, &recovery.Config{Batch: 100, OwnerID: "recovery-test", RedriveAfter: time.Hour,
		OnAttemptUnknownFunc: l.addUnknown, OnAtRiskFunc: l.setAtRisk})

	b.admit(t, "s", "m1", "hello")
	c := b.startTurn(t, "s", "m1")
	id := ledger.AttemptID(c.x.Claim().ExecutionID, 1)
	require.NoError(t, c.x.Write(ctx, func(tx pgx.Tx) error {
		return c.x.BeginAttempt(ctx, tx, ledger.AttemptParams{ID: id, AssistantMessageID: c.assistant, Step: 1,
			Provider: "openai", IdempotencyKey: id, RequestHash: []byte{1}, Model: "gpt-x", RequestTokens: 321})
	}))
	recorded, err := c.x.RecordResponseID(ctx, id, "req-1")
	require.NoError(t, err)
	require.True(t, recorded)
	recorded, err = c.x.RecordResponseID(ctx, id, "req-2")
	require.NoError(t, err)
	require.False(t, recorded, "the first ID stays")
	b.die(t, "s")

	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Decisions[recovery.DecisionReconciled])
	require.Equal(t, map[[2]string]int{{"openai", "gpt-x"}: 1}, l.unknown)
	require.Equal(t, []ledger.AtRisk{{Provider: "openai", Model: "gpt-x", Attempts: 1, Tokens: 321}}, l.atRisk[0])
	recs := b.records(t, "s")
	require.Len(t, recs, 1)
	require.Equal(t, []recovery.AttemptFact{{ID: id, Step: 1, Provider: "openai", State: "started",
		Model: "gpt-x", RequestTokens: 321, ResponseID: "req-1"}}, recs[0].Evidence.Attempts)

	// The fence holds for the response ID too: the dead execution's
	// late write is refused.
	_, err = c.x.RecordResponseID(ctx, id, "req-late")
	require.ErrorIs(t, err, ledger.ErrFenced)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND response_id = 'req-1'`, id))

	_, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, map[[2]string]int{{"openai", "gpt-x"}: 1}, l.unknown, "counted once")
	require.Len(t, l.atRisk, 2)
	require.Equal(t, l.atRisk[0], l.atRisk[1], "still at risk until resolved")
}
