package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/recovery"
)

// After each pass, in auto and in hold, OnQuarantinedFunc is given the
// quarantined rows by kind as the database counts them
// (promptline_quarantined_rows).
func TestRecoveryReportsTheQuarantinedCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `INSERT INTO sessions (session_id) VALUES ('poison')`)
	b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ('poison', 'poison-exec', 'dead', 1, 'bogus', now() - interval '1 hour')`)
	var reported []map[string]int
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour,
		OnQuarantinedFunc: func(counts map[string]int) { reported = append(reported, counts) }})

	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Decisions[recovery.DecisionQuarantined])
	want := map[string]int{recovery.KindClaim: 1, recovery.KindInput: 0, recovery.KindOutbox: 0}
	require.Equal(t, []map[string]int{want}, reported)

	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	_, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []map[string]int{want, want}, reported, "a held pass reports them too")
}

// The counts run on every pass of every process, and the outbox and the
// inputs hold every row of their retention: they read the quarantined rows'
// indexes (migration 00019), never the tables, whatever the planner knows.
// Before the first analyze of a table (a fresh or restored database, the
// first minute of a deployment) it takes IS NOT NULL to hold for nearly
// every row, and a count planned then, and cached on its connection, read
// the whole table at every pass until an analyze.
func TestQuarantinedCountsReadNoTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, dbURL := testkit.Pool(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = 1 // the counts and the reads of their statistics on one backend
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, sql := range []string{
		`ALTER TABLE outbox SET (autovacuum_enabled = false)`,
		`ALTER TABLE inputs SET (autovacuum_enabled = false)`,
		`INSERT INTO outbox (topic, key, payload, published_at)
		 SELECT 't', 's' || g, '\x00', now() FROM generate_series(1, 50000) g`,
		`INSERT INTO sessions (session_id) VALUES ('s')`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, promotion_seq, kind)
		 SELECT 'm' || g, 's', 'x', '\x00', 'queue', false, g, 'prompt' FROM generate_series(1, 50000) g`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	seqScans := func() (n int64) {
		t.Helper()
		_, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_user_tables
			WHERE relname IN ('outbox', 'inputs')`).Scan(&n))
		return n
	}
	before := seqScans()
	for range 3 {
		counts, err := recovery.QuarantinedCounts(ctx, pool)
		require.NoError(t, err)
		require.Equal(t, map[string]int{recovery.KindClaim: 0, recovery.KindInput: 0, recovery.KindOutbox: 0}, counts)
	}
	require.Equal(t, before, seqScans(), "a count read a whole table")
}
