package outbox

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
)

// fill writes n outbox rows for key; published, when not zero, marks them
// published that long ago.
func fill(t *testing.T, pool *pgxpool.Pool, key string, n int, published time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO outbox (topic, key, payload, published_at)
		SELECT 't', $1, '\x00', CASE WHEN $3::bigint > 0 THEN now() - $3 * interval '1 millisecond' END
		FROM generate_series(1, $2)`, key, n, published.Milliseconds())
	require.NoError(t, err)
}

func countKey(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	return testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE key = $1`, key)
}

// The pruner deletes exactly the rows published longer ago than the
// retention, in bounded batches, steps over quarantined rows, and stops at
// the young part of the table.
func TestPruner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeletesOnlyRowsPublishedLongerAgoThanTheRetention", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 25, 2*time.Hour)
		fill(t, pool, "quarantined", 3, 0)
		_, err := pool.Exec(ctx, `UPDATE outbox SET quarantine_reason = 'too big', quarantined_at = now() WHERE key = 'quarantined'`)
		require.NoError(t, err)
		fill(t, pool, "old2", 12, 90*time.Minute)
		fill(t, pool, "unpublished", 4, 0)
		fill(t, pool, "recent", 5, time.Minute)

		var batches []int
		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, BatchSize: 10, OnPruned: func(n int) { batches = append(batches, n) }})
		n, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 37, n)
		require.Equal(t, []int{10, 10, 7, 10}, batches, "batches of at most 10, past the quarantined rows")
		require.Zero(t, countKey(t, pool, "old"))
		require.Zero(t, countKey(t, pool, "old2"))
		require.Equal(t, 3, countKey(t, pool, "quarantined"), "quarantined rows stay for the operator")
		require.Equal(t, 4, countKey(t, pool, "unpublished"), "unpublished rows stay for the relay")
		require.Equal(t, 5, countKey(t, pool, "recent"), "rows within the retention stay")

		n, err = p.Prune(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "nothing left to prune")
	})

	// A pass is bounded; the next one goes on where the table still holds
	// old rows.
	t.Run("APassIsBounded", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 50, 2*time.Hour)
		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, BatchSize: 10, MaxBatches: 2})
		n, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 20, n)
		require.Equal(t, 30, countKey(t, pool, "old"))
	})

	// The scan stops at the first batch holding a row to keep: rows after
	// it are younger, and a pass must not read the whole table to find
	// none.
	t.Run("StopsAtTheYoungPart", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 5, 2*time.Hour)
		fill(t, pool, "recent", 30, time.Minute)
		fill(t, pool, "late", 5, 2*time.Hour) // published long ago, but written after young rows
		var batches int
		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, BatchSize: 10, OnPruned: func(int) { batches++ }})
		n, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		require.Equal(t, 1, batches, "one batch read")
		require.Equal(t, 5, countKey(t, pool, "late"), "behind the young rows: left for a later pass")
	})

	// An unpublished row stops the pass as a young one does: the batch
	// that read it deletes its old rows, and the rows behind that batch
	// wait for a later pass (its published_at is NULL, which "old" must
	// not read as false).
	t.Run("StopsAtAnUnpublishedRow", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 5, 2*time.Hour)
		fill(t, pool, "unpublished", 1, 0)
		fill(t, pool, "late", 15, 2*time.Hour)
		var batches int
		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, BatchSize: 10, OnPruned: func(int) { batches++ }})
		n, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 9, n, "the batch's old rows: 5 before the unpublished one, 4 after")
		require.Equal(t, 1, batches, "one batch read")
		require.Equal(t, 1, countKey(t, pool, "unpublished"))
		require.Equal(t, 11, countKey(t, pool, "late"), "behind the batch: left for a later pass")
	})

	// Every consumer runs a pruner: while one prunes, the others' passes
	// end at once.
	t.Run("OnePrunerAtATime", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 7, 2*time.Hour)
		other, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = other.Rollback(ctx) }()
		_, err = other.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, PruneLockKey)
		require.NoError(t, err)

		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour})
		n, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "another pruner's batch runs")
		require.Equal(t, 7, countKey(t, pool, "old"))

		require.NoError(t, other.Rollback(ctx))
		n, err = p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 7, n)
	})

	t.Run("StartPrunesEveryInterval", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, Interval: 20 * time.Millisecond})
		require.NoError(t, p.Start(ctx))
		defer p.Stop()
		fill(t, pool, "old", 7, 2*time.Hour)
		require.Eventually(t, func() bool { return countKey(t, pool, "old") == 0 }, 10*time.Second, 10*time.Millisecond)
	})

	// A failed pass is logged and retried at the next interval.
	t.Run("RunLogsFailedPasses", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		closed, err := pgxpool.New(ctx, pool.Config().ConnString())
		require.NoError(t, err)
		closed.Close()
		logs := &logRecorder{}
		p := mustPruner(t, closed, &PrunerConfig{Retention: time.Hour, Interval: 10 * time.Millisecond, Logger: slog.New(logs)})
		require.NoError(t, p.Start(ctx))
		require.Eventually(t, func() bool { return len(logs.warnings()) >= 2 }, 10*time.Second, 10*time.Millisecond)
		p.Stop()
		require.Contains(t, logs.warnings()[0], "outbox pruning failed; retrying at the next interval")
		require.Contains(t, logs.warnings()[0], "closed pool")
	})

	_, err := NewPruner(nil, &PrunerConfig{})
	require.ErrorContains(t, err, "PrunerConfig.Retention must be positive", "a pruner without retention")
}

// Not parallel: the stress test's leak check counts every goroutine.
func TestPrunerStartStop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		pool, _ := testkit.Pool(t)
		fill(t, pool, "old", 7, 2*time.Hour)
		startstoptest.Stress(t, mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, Interval: time.Millisecond}))
	})
}

func mustPruner(t testing.TB, pool *pgxpool.Pool, cfg *PrunerConfig) *Pruner {
	t.Helper()
	p, err := NewPruner(pool, cfg)
	require.NoError(t, err)
	return p
}
