package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// execution writes a settled execution of session: steps attempts, each
// with calls tool calls, all finished age ago.
func (b *testBundle) execution(t *testing.T, session, execution string, steps, calls int, age time.Duration) {
	t.Helper()
	for s := 1; s <= steps; s++ {
		id := ledger.AttemptID(execution, s)
		b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state, started_at, finished_at)
			VALUES ($1, $2, $3, 'a', $4, 'p', $1, 1, '\x00', 'succeeded', now() - $5 * interval '1 millisecond', now() - $5 * interval '1 millisecond')`,
			id, session, execution, s, age.Milliseconds())
		for c := range calls {
			b.exec(t, `INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
					input, idempotency_key, fencing_token, state, requested_at, finished_at)
				VALUES ($1, $2, $3, $4, $5, 'm', 't', 'side_effecting', '{}', $1, 1, 'succeeded',
					now() - $6 * interval '1 millisecond', now() - $6 * interval '1 millisecond')`,
				fmt.Sprintf("%s/call-%d", id, c), id, session, execution, c, age.Milliseconds())
		}
	}
}

func (b *testBundle) ledgerRows(t *testing.T, execution string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM attempts WHERE execution_id = $1`, execution) +
		b.count(t, `SELECT count(*) FROM tool_calls c JOIN attempts a ON a.attempt_id = c.attempt_id WHERE a.execution_id = $1`, execution)
}

func TestPruner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const (
		retention = 24 * time.Hour
		old       = 48 * time.Hour
	)

	t.Run("DeletesOnlyWhatNothingCanNeed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		for _, s := range []string{"idle", "claimed", "quarantined", "waiting", "parked", "asked", "continued", "uncertain"} {
			b.session(t, s, 0)
		}
		// Pruned: settled and old, in an idle session; a second one of the
		// same session too.
		b.execution(t, "idle", "e-gone-1", 3, 2, old)
		b.execution(t, "idle", "e-gone-2", 1, 0, old)
		// Kept: young.
		b.execution(t, "idle", "e-young", 2, 1, time.Hour)
		// Kept: one of its steps young (an execution goes whole or not at all).
		b.execution(t, "idle", "e-half", 1, 1, old)
		b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
				idempotency_key, fencing_token, request_hash, state, finished_at)
			VALUES ('e-half/step-2', 'idle', 'e-half', 'a', 2, 'p', 'k', 1, '\x00', 'failed', now())`)
		// Kept: the session holds a claim (of another, live, execution).
		b.execution(t, "claimed", "e-claimed", 1, 1, old)
		b.acquire(t, "claimed", "e-live")
		// Kept: the session's claim is quarantined (its own execution).
		b.execution(t, "quarantined", "e-quarantined", 1, 1, old)
		b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason)
			VALUES ('quarantined', 'e-quarantined', 'o', 1, 'unknown', now() - interval '1 hour', 'poison')`)
		// Kept: an input waits.
		b.execution(t, "waiting", "e-waiting", 1, 0, old)
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('w', 'waiting', 'x', '\x00', 'queue', true)`)
		// Kept: a call parked, still requested.
		b.execution(t, "parked", "e-parked", 1, 2, old)
		b.exec(t, `UPDATE tool_calls SET state = 'requested', finished_at = NULL WHERE call_id = 'e-parked/step-1/call-1'`)
		// Kept: a call with a permission request (answered, settled).
		b.execution(t, "asked", "e-asked", 1, 1, old)
		b.exec(t, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
			VALUES ('r', 'asked', 'e-asked/step-1/call-0', 't', '*', 'approved')`)
		// Kept: recovery continued it, the continuation not yet promoted
		// (it reads the retried attempt's idempotency key), even though it
		// does not wait (quarantined).
		b.execution(t, "continued", "e-continued", 1, 0, old)
		b.exec(t, `UPDATE attempts SET state = 'unknown' WHERE execution_id = 'e-continued'`)
		b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after,
				continuation_message_id, retry_attempt_id, recovered_by)
			VALUES ('e-continued', 'continued', 'unknown', 'continued', '{}', 1, 2, 'recovery-continue-e-continued', 'e-continued/step-1', 'r')`)
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, quarantine_reason)
			VALUES ('recovery-continue-e-continued', 'continued', '', '\x00', 'steer', true, 'poison')`)
		// Kept: an attempt never settled (started: its outcome unknown and
		// not reconciled), even without a claim.
		b.execution(t, "uncertain", "e-uncertain", 1, 0, old)
		b.exec(t, `UPDATE attempts SET state = 'started', finished_at = NULL WHERE execution_id = 'e-uncertain'`)

		kept := map[string]int{}
		for _, e := range []string{"e-young", "e-half", "e-claimed", "e-quarantined", "e-waiting", "e-parked", "e-asked", "e-continued", "e-uncertain"} {
			kept[e] = b.ledgerRows(t, e)
			require.NotZero(t, kept[e], e)
		}
		var pruned [][2]int
		p := mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: retention, BatchSize: 2,
			OnPruned: func(a, c int) { pruned = append(pruned, [2]int{a, c}) }})
		attempts, calls, err := p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 4, attempts, "e-gone-1's three steps and e-gone-2's one")
		require.Equal(t, 6, calls)
		require.Zero(t, b.ledgerRows(t, "e-gone-1"))
		require.Zero(t, b.ledgerRows(t, "e-gone-2"))
		for e, n := range kept {
			require.Equal(t, n, b.ledgerRows(t, e), "%s is kept whole", e)
		}
		sum := [2]int{}
		for _, n := range pruned {
			sum[0], sum[1] = sum[0]+n[0], sum[1]+n[1]
		}
		require.Equal(t, [2]int{4, 6}, sum, "OnPruned counts every deleted row")

		// Once the continuation is promoted (settled), and the claim and
		// the waiting input are gone, those go too; the young stay.
		b.exec(t, `UPDATE recoveries SET settled_at = now() WHERE execution_id = 'e-continued'`)
		b.exec(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now() WHERE session_id = 'waiting'`)
		b.exec(t, `DELETE FROM claims WHERE session_id = 'quarantined'`)
		_, _, err = p.Prune(ctx)
		require.NoError(t, err)
		for _, e := range []string{"e-continued", "e-waiting", "e-quarantined"} {
			require.Zero(t, b.ledgerRows(t, e), e)
		}
		for _, e := range []string{"e-young", "e-half", "e-claimed", "e-parked", "e-asked", "e-uncertain"} {
			require.Equal(t, kept[e], b.ledgerRows(t, e), e)
		}
	})

	t.Run("BoundedBatchesGoOnWhereThePassEnded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		// Executions kept (young) sort before the prunable ones: they
		// never stop the walk.
		for i := range 6 {
			b.execution(t, "s", fmt.Sprintf("a-young-%d", i), 1, 0, time.Minute)
		}
		for i := range 6 {
			b.execution(t, "s", fmt.Sprintf("b-old-%d", i), 1, 1, old)
		}
		p := mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: retention, BatchSize: 2, MaxBatches: 4})
		var passes []int
		for range 4 {
			a, _, err := p.Prune(ctx)
			require.NoError(t, err)
			passes = append(passes, a)
		}
		// Pass 1: batches of young (3) then b-old-0/1; pass 2: b-old-2..5
		// and the end of the walk; passes 3 and 4 start over, nothing left.
		require.Equal(t, []int{2, 4, 0, 0}, passes)
		require.Equal(t, 6, b.count(t, `SELECT count(*) FROM attempts`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls`))
	})

	t.Run("OnePrunerAtATime", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.execution(t, "s", "e", 1, 1, old)
		other, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = other.Rollback(context.WithoutCancel(ctx)) }()
		_, err = other.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, ledger.PruneLockKey)
		require.NoError(t, err)

		p := mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: retention})
		a, _, err := p.Prune(ctx)
		require.NoError(t, err, "another pruner's batch is not an error")
		require.Zero(t, a)
		require.Equal(t, 2, b.ledgerRows(t, "e"))

		require.NoError(t, other.Rollback(ctx))
		a, _, err = p.Prune(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, a)
	})

	t.Run("StartPrunesUntilStopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.execution(t, "s", "e", 2, 1, old)
		p := mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: retention, Interval: 20 * time.Millisecond})
		require.NoError(t, p.Start(ctx))
		require.Eventually(t, func() bool { return b.ledgerRows(t, "e") == 0 }, 10*time.Second, 20*time.Millisecond)
		p.Stop()
	})

	t.Run("RetentionMustBePositive", func(t *testing.T) {
		t.Parallel()
		for _, retention := range []time.Duration{0, -time.Second} {
			p, err := ledger.NewPruner(nil, &ledger.PrunerConfig{Retention: retention})
			require.ErrorContains(t, err, "PrunerConfig.Retention must be positive", "retention %v", retention)
			require.Nil(t, p)
		}
	})
}

// Not parallel: the stress test's leak check counts every goroutine.
func TestPrunerStartStop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.execution(t, "s", "e", 2, 1, 48*time.Hour)
		startstoptest.Stress(t, mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: 24 * time.Hour, Interval: time.Millisecond}))
	})
}

func mustPruner(t testing.TB, pool *pgxpool.Pool, cfg *ledger.PrunerConfig) *ledger.Pruner {
	t.Helper()
	p, err := ledger.NewPruner(pool, cfg)
	require.NoError(t, err)
	return p
}

// stmtLog records the SQL of every statement sent.
type stmtLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *stmtLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (*stmtLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The pruner holds its lock before the statement that judges and deletes
// takes its snapshot: a resolve (which takes the same lock to re-arm an
// unknown call) that commits between a statement's snapshot and a lock
// taken inside it would go unseen, and the re-armed call would be deleted
// under the continuation that runs it.
func TestPrunerLocksBeforeItsSnapshot(t *testing.T) {
	t.Parallel()
	_, url := testkit.Pool(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	log := &stmtLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p, err := ledger.NewPruner(pool, &ledger.PrunerConfig{Retention: time.Hour})
	require.NoError(t, err)
	_, _, err = p.Prune(context.Background())
	require.NoError(t, err)

	log.mu.Lock()
	defer log.mu.Unlock()
	lockAt, pruneAt := -1, -1
	for i, sql := range log.sql {
		switch {
		case strings.Contains(sql, "DELETE FROM attempts"):
			pruneAt = i
		case lockAt < 0 && strings.Contains(sql, "pg_try_advisory_xact_lock"):
			lockAt = i
		}
	}
	require.GreaterOrEqual(t, lockAt, 0, "%q", log.sql)
	require.Greater(t, pruneAt, lockAt, "the lock is taken by an earlier statement than the prune's: %q", log.sql)
}
