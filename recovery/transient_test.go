package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// poolWith opens a pool on the bundle's database whose sessions carry the
// given settings (lock_timeout, statement_timeout).
func (b *testBundle) poolWith(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	require.NoError(t, err)
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// holdSession locks the session row from another connection, as a long
// admission or a stuck writer would, until the returned func is called.
func (b *testBundle) holdSession(t *testing.T, session string) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, session)
	require.NoError(t, err)
	var once sync.Once
	release := func() { once.Do(func() { require.NoError(t, tx.Rollback(ctx)) }) }
	t.Cleanup(release)
	return release
}

// decisions records the decisions a recoverer reports to its callback.
type decisions struct {
	mu  sync.Mutex
	all []recovery.DecisionKind
}

func (d *decisions) add(s recovery.DecisionKind) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, s)
}

func (d *decisions) get() []recovery.DecisionKind {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]recovery.DecisionKind(nil), d.all...)
}

// A transient database error during a decision says nothing about the
// claim (docs/design.md, invariant 13): the claim is left as it was, never
// quarantined, and the next pass decides it. Before the fix each of these
// quarantined a healthy claim ("decision failed: ...") and the session
// waited for an operator.
func TestRecoveryTransientErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// expiredReady leaves a ready claim with a waiting input, as a process
	// killed right after acquiring does.
	expiredReady := func(t *testing.T, b *testBundle) {
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s")
		b.die(t, "s")
	}
	// leftForNextPass checks the failed pass quarantined nothing, then that
	// the next one, with the cause gone, decides.
	leftForNextPass := func(t *testing.T, b *testBundle, rec *recovery.Recoverer, p recovery.Pass, release func(), seen *decisions, retried []int) {
		t.Helper()
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`), "a transient error quarantined the claim")
		require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries`))
		require.Zero(t, p.Decisions[recovery.DecisionQuarantined])
		require.Zero(t, p.Failed)
		require.Equal(t, 1, p.Retried, "the claim is left for the next pass")
		require.Empty(t, seen.get(), "no decision was made")
		require.Equal(t, []int{1}, retried, "the transient error is counted")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'exec-s'`), "the claim is as it was")
		release()
		wakes := b.wakes(t, "s")
		p, err := rec.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, p.Decisions[recovery.DecisionRewoken], "the next pass completes the decision")
		require.Equal(t, []recovery.DecisionKind{recovery.DecisionRewoken}, seen.get())
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Equal(t, wakes+1, b.wakes(t, "s"))
	}

	for _, tc := range []struct {
		name   string
		params map[string]string
	}{
		{"LockTimeout", map[string]string{"lock_timeout": "100ms"}},           // 55P03
		{"StatementTimeout", map[string]string{"statement_timeout": "100ms"}}, // 57014
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			expiredReady(t, b)
			seen := &decisions{}
			var retried []int
			rec := recovery.New(b.poolWith(t, tc.params), &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour,
				OnDecisionFunc: seen.add, OnTransientErrorFunc: func() { retried = append(retried, 1) }})
			release := b.holdSession(t, "s")
			p, err := rec.RunOnce(ctx)
			require.NoError(t, err)
			leftForNextPass(t, b, rec, p, release, seen, retried)
		})
	}

	t.Run("TerminatedBackend", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		expiredReady(t, b)
		seen := &decisions{}
		var mu sync.Mutex
		var retried []int
		rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour,
			OnDecisionFunc: seen.add, OnTransientErrorFunc: func() { mu.Lock(); retried = append(retried, 1); mu.Unlock() }})
		release := b.holdSession(t, "s")
		passed := make(chan recovery.Pass, 1)
		go func() {
			p, err := rec.RunOnce(ctx)
			if err != nil {
				t.Error(err)
			}
			passed <- p
		}()
		// The decision waits for the session row: end its backend there,
		// as a failover or a pooler restart does (SQLSTATE 57P01).
		var pid int
		require.Eventually(t, func() bool {
			err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`).Scan(&pid)
			return err == nil
		}, 10*time.Second, 5*time.Millisecond)
		var ok bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
		require.True(t, ok)
		p := <-passed
		mu.Lock()
		got := append([]int(nil), retried...)
		mu.Unlock()
		leftForNextPass(t, b, rec, p, release, seen, got)
	})
}

// A decision that fails deterministically is quarantined, and that
// quarantine is a decision like the others: counted in the pass and
// reported to OnDecisionFunc (promptline_recovery_decisions_total). Before
// the fix the callback was skipped.
func TestRecoveryDecisionFailureQuarantineIsCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "a", "m1", "/tool echo {}")
	b.admit(t, "b", "m2", "hello")
	c := b.startTurn(t, "a", "m1")
	attempt := b.beginAttempt(t, c, 1, "scripted")
	calls := b.toolStep(t, c, attempt, map[string]string{"echo": "idempotent"}, map[string]string{"echo": `{}`})
	b.settleCall(t, c, calls[0], "x") // phase continue
	// Poison: the continuation's ID is taken by a continuation input of
	// session b (a prompt holding it would only move the continuation to
	// its other ID).
	b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, promotion_seq, kind)
		VALUES ($1, 'b', '', '\x00', 'steer', false, nextval('promotion_seq'), 'continuation')`, recovery.ContinuationID("exec-a"))
	b.die(t, "a")
	seen := &decisions{}
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour, OnDecisionFunc: seen.add})

	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Failed)
	require.Equal(t, 1, p.Decisions[recovery.DecisionQuarantined])
	require.Equal(t, []recovery.DecisionKind{recovery.DecisionQuarantined}, seen.get(), "the quarantine is counted like the other decisions")
	rows, err := recovery.ListQuarantined(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Contains(t, rows[0].Reason, "decision failed: continuation input "+recovery.ContinuationID("exec-a")+" belongs to session b")

	// Skipped by the next pass: nothing more is counted.
	p, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, p.Decisions)
	require.Len(t, seen.get(), 1)
}
