package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

// A deferred attempt's next_retry_at that is not a time ('-infinity',
// 'infinity': the column admits both; a hand edit, a restore or a repair
// script may leave one) says nothing of when the retry is due: AttemptRetry
// reads it as due now instead of failing on the clock's subtraction (a
// data error, which would fail the executor's deferral and leave its turn
// to recovery).
func TestAttemptRetryReadsATimeThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			b.session(t, "s", 0)
			x := b.acquire(t, "s", "e1")
			p := ledger.AttemptParams{ID: ledger.AttemptID("e1", 1), AssistantMessageID: "a1", Step: 1,
				Provider: "scripted", IdempotencyKey: "k1", RequestHash: []byte{1}}
			require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.BeginAttempt(ctx, tx, p) }))
			require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
				return x.DeferAttempt(ctx, tx, p.ID, time.Minute, "rate limited")
			}))
			b.exec(t, `UPDATE attempts SET next_retry_at = $1::timestamptz WHERE attempt_id = $2`, value, p.ID)

			require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
				tries, wait, err := ledger.AttemptRetry(ctx, tx, p.ID)
				if err != nil {
					return err
				}
				require.Equal(t, 1, tries)
				require.Zero(t, wait, "a time that is not a time is due now")
				return nil
			}))
		})
	}
}
