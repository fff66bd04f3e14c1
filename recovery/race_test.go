package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// An input admitted while recovery decides must not be orphaned: recovery
// counts waiting inputs under the session row lock, so an admission that
// holds the row is either seen (and woken) or commits after the claim is
// gone (and its own wake runs it). Before the fix, recovery counted first
// and locked later, and cleared the claim without a wake.
func TestRecoverySerialisesWithAdmission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "s", "m0", "first")
	// m0 claimed and promoted (already run): the claim is left with
	// nothing waiting.
	x := b.acquire(t, "s", "exec-s")
	require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE inputs SET promotion_seq = nextval('promotion_seq') WHERE message_id = 'm0'`)
		return err
	}))
	b.die(t, "s")
	wakesBefore := b.wakes(t, "s")

	// An admission in flight: it holds the session row.
	admission, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer admission.Rollback(context.WithoutCancel(ctx))
	_, err = admission.Exec(ctx, `UPDATE sessions SET last_admitted_at = now() WHERE session_id = 's'`)
	require.NoError(t, err)
	_, err = admission.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		VALUES ('m1', 's', 'second', '\x00', 'queue', true)`)
	require.NoError(t, err)

	passed := make(chan recovery.Pass, 1)
	go func() {
		p, err := b.rec.RunOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		passed <- p
	}()
	// Wait until the pass waits for the session row.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, admission.Commit(ctx))

	p := <-passed
	require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken])
	require.Equal(t, 1, b.records(t, "s")[0].Evidence.WaitingInputs, "recovery saw the input admitted while it waited")
	require.Equal(t, wakesBefore+1, b.wakes(t, "s"), "and woke the session for it")
}
