package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider/scripted"
)

// A promotion the server refused committed nothing, so its try again must
// not leave a trace in memory either: the execution's attempt IDs number
// its provider steps (ledger.AttemptID, "deterministic from it"), and the
// refused try's number is not one of them. Two plain prompts: the first is
// claimed with its turn, the second promoted after it (promoteQueued),
// refused once by the server.
func TestRefusedPromotionKeepsAttemptNumbering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	e := b.executor(t, "p", scripted.ScriptedProvider{}, time.Minute, 0)
	b.admit(t, "s", "m1", "first")
	b.admit(t, "s", "m2", "second")
	_, err := b.pool.Exec(ctx, refuseOnce("m2", "40P01", `BEFORE UPDATE OF promotion_seq ON inputs
		FOR EACH ROW WHEN (OLD.promotion_seq IS NULL AND NEW.promotion_seq IS NOT NULL AND NEW.message_id = 'm2')`))
	require.NoError(t, err)

	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 2, b.count(t, `SELECT last_value FROM m2_tries`), "refused once, then promoted")
	require.Equal(t, 1, b.answered(t, "m1"))
	require.Equal(t, 1, b.answered(t, "m2"))
	require.Equal(t, 1, b.count(t, `SELECT count(DISTINCT execution_id) FROM attempts`), "one execution")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM attempts
		WHERE attempt_id IN (execution_id || '/step-1', execution_id || '/step-2')`),
		"the execution's two provider steps are numbered 1 and 2")
}
