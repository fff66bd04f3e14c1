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

// FindVoucher reads what admitted a continuation: a recovery (with the
// turn its evidence names and the attempt it sends again) or an
// operator's resolution; found is false when nothing did.
func TestFindVoucher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	for _, q := range []string{
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, continuation_message_id, retry_attempt_id, recovered_by)
			VALUES ('e', 's', 'continue', 'continued', '{"assistant_message_id": "a1"}', 1, 2, 'c', 'e/step-1', 'test')`,
		`INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, continuation_message_id, recovered_by)
			VALUES ('bare', 's', 'continue', 'continued', '{}', 2, 3, 'c-bare', 'test')`,
		`INSERT INTO resolutions (target_id, round, target_kind, session_id, execution_id, assistant_message_id, finding, state_before, continuation_message_id, resolved_by)
			VALUES ('t', 1, 'tool_call', 's', 'e2', 'a2', 'ran', 'unknown', 'r', 'test')`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	find := func(id string) (recovery.Voucher, bool) {
		t.Helper()
		var v recovery.Voucher
		var found bool
		require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
			var err error
			v, found, err = recovery.FindVoucher(ctx, tx, &recovery.FindVoucherParams{ContinuationID: id})
			return err
		}))
		return v, found
	}

	v, found := find("c")
	require.True(t, found)
	require.Equal(t, recovery.Voucher{SessionID: "s", AssistantMessageID: "a1", RetryAttemptID: "e/step-1"}, v)
	v, found = find("c-bare")
	require.True(t, found)
	require.Equal(t, recovery.Voucher{SessionID: "s"}, v, "evidence without a message, no retry: empty")
	v, found = find("r")
	require.True(t, found)
	require.Equal(t, recovery.Voucher{SessionID: "s", AssistantMessageID: "a2"}, v, "a resolution sends no attempt again")

	require.NoError(t, pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		return recovery.SettleContinuation(ctx, tx, &recovery.SettleContinuationParams{SessionID: "s", ContinuationID: "c"})
	}))
	_, found = find("c")
	require.True(t, found, "a settled recovery still vouches")

	v, found = find("nothing")
	require.False(t, found)
	require.Zero(t, v)
}
