package recovery_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// cancelAfterCommit cancels a context right after the commit of the first
// transaction that sent a statement holding arm: the transaction is
// committed, and the caller's context is done when the call returns.
type cancelAfterCommit struct {
	arm    string
	cancel context.CancelFunc

	mu    sync.Mutex
	armed bool
}

func (c *cancelAfterCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.Contains(data.SQL, c.arm) {
		c.armed = true
	}
	return context.WithValue(ctx, c, data.SQL)
}

func (c *cancelAfterCommit) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sql, _ := ctx.Value(c).(string); c.armed && sql == "commit" && data.Err == nil {
		c.armed = false
		c.cancel()
	}
}

// An apply cancelled right after a decision, a quarantine or a re-wake
// committed counts it: what an apply reports (and records as applied) is
// what it committed, even when the operator stops it at that moment.
func TestApplyCountsWhatCommittedBeforeACancel(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		arm    string
		failed int
		want   recovery.DecisionKind
	}{
		"Decision":                       {arm: "INSERT INTO recoveries", want: recovery.DecisionRewoken},
		"QuarantineAfterAFailedDecision": {arm: "SET quarantine_reason = $5", failed: 1, want: recovery.DecisionQuarantined},
		"LostWake":                       {arm: "SET redriven_at = now()", want: recovery.DecisionRedriven},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.want == recovery.DecisionRedriven {
				b.admit(t, "w", "w1", "lost its wake")
				b.exec(t, `UPDATE inputs SET admitted_at = now() - interval '1 hour' WHERE session_id = 'w'`)
			} else {
				b.admit(t, "r1", "r1m", "hello")
				b.acquire(t, "r1", "exec-r1")
				b.die(t, "r1")
			}
			if tc.failed > 0 {
				b.exec(t, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence, token_before, token_after, recovered_by)
					VALUES ('exec-r1', 'r1', 'ready', 'rewoken', '{}', 1, 2, 'earlier')`)
			}
			require.NoError(t, recovery.SetMode(context.Background(), b.pool, recovery.ModeHold, "ops", "look first"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cfg, err := pgxpool.ParseConfig(b.url)
			require.NoError(t, err)
			cfg.ConnConfig.Tracer = &cancelAfterCommit{arm: tc.arm, cancel: cancel}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			rec := recovery.New(pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Minute})

			a, err := rec.Apply(ctx, &recovery.ApplyOpts{Operator: "ops", Rate: 1000})
			require.ErrorIs(t, err, context.Canceled)
			require.Equal(t, map[recovery.DecisionKind]int{tc.want: 1}, a.Decisions, "what committed is counted")
			require.Equal(t, tc.failed, a.Failed)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recovery_actions WHERE id = $1 AND applied = 1`, a.ID))
		})
	}
}
