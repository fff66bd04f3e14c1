package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestStopBetweenSendAndMarkSendsOnce: a Stop that cancels the loop's
// context while its pass sends does not cancel the pass's mark (the mark
// runs on a context the loop's cancellation does not reach): cancelled, it
// left the rows Kafka took unmarked, and the last pass of the stop sent
// them again.
func TestStopBetweenSendAndMarkSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay := b.newRelay(&RelayConfig{PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, relay.Start(ctx))
	waitIdle(t, relay)
	sent := make(chan struct{})
	var once sync.Once
	relay.afterSend = func() { once.Do(func() { cancel(); close(sent) }) }
	commit(t, b.pool, row("k", 1), row("k", 2))
	relay.Nudge()
	<-sent // the pass sent the rows; the loop's context ends before they are marked
	relay.Stop()
	require.Zero(t, unpublished(t, b.pool))
	readTopic(t, b.broker.Addr(), testTopic, 2) // each once
}

// TestSettleTwiceChangesNothing: settle skips rows already published, so
// that the mark the relay runs again without the relay's lock (after a
// lost answer) neither moves published_at (the pruner's clock and the
// publish delay reported) nor quarantines a row another relay published.
func TestSettleTwiceChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	commit(t, b.pool, row("k", 1))
	var id int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM outbox`).Scan(&id))
	published := func() (p time.Time, q *string) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT published_at, quarantine_reason FROM outbox WHERE id = $1`, id).Scan(&p, &q))
		return p, q
	}
	settleTx := func(ids []int64, quarantine map[int64]string) {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := settle(ctx, tx, ids, quarantine)
			return err
		}))
	}
	settleTx([]int64{id}, nil)
	// Published an hour ago, as far as a second mark can tell: one that
	// marked again would set now().
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET published_at = published_at - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	first, _ := published()
	settleTx([]int64{id}, map[int64]string{id: "refused elsewhere"})
	again, q := published()
	require.Equal(t, first, again, "a second mark leaves published_at as it was")
	require.Nil(t, q, "a published row is never quarantined")
}
