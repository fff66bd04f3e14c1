package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// SettleContinuation settles the recovery and the resolution that admitted
// a continuation, of that session only, once.
func TestSettleContinuation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	for _, q := range []string{
		`INSERT INTO sessions (session_id) VALUES ('s'), ('other')`,
		`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, continuation_message_id, recovered_by)
			VALUES ('e', 's', 'continue', 'continued', '{}', 1, 2, 'c', 'test')`,
		`INSERT INTO resolutions (target_id, round, target_kind, session_id, execution_id, assistant_message_id, finding, state_before, continuation_message_id, resolved_by)
			VALUES ('t', 1, 'tool_call', 's', 'e2', 'a', 'ran', 'unknown', 'r', 'test')`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	settle := func(session, id string) {
		require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
			return recovery.SettleContinuation(ctx, tx, &recovery.SettleContinuationParams{SessionID: session, ContinuationID: id})
		}))
	}
	settledAt := func(q string) *time.Time {
		var at *time.Time
		require.NoError(t, pool.QueryRow(ctx, q).Scan(&at))
		return at
	}
	recovered := func() *time.Time { return settledAt(`SELECT settled_at FROM recoveries WHERE execution_id = 'e'`) }
	resolved := func() *time.Time { return settledAt(`SELECT settled_at FROM resolutions WHERE target_id = 't'`) }

	settle("other", "c")
	settle("other", "r")
	require.Nil(t, recovered(), "another session's continuation settles nothing")
	require.Nil(t, resolved())

	settle("s", "c")
	first := recovered()
	require.NotNil(t, first)
	require.Nil(t, resolved(), "the resolution of another continuation is not settled")
	settle("s", "r")
	require.NotNil(t, resolved())

	settle("s", "c")
	require.Equal(t, first, recovered(), "settling again keeps the first settlement")
}
