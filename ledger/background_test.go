package ledger_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// KeepAlive warns about a renewal that failed for a reason other than the
// fence, and only then: an operator reads the warning as a database in
// trouble.
func TestKeepAliveWarnsOnlyOnFailedRenewals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	logs := &testkit.LogBuffer{}
	renewed := make(chan struct{}, 16)
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease:         300 * time.Millisecond,
		OwnerID:       "owner-a",
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
		OnRenewedFunc: func() { renewed <- struct{}{} },
	})
	b := &testBundle{pool: pool, claims: claims}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")

	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })

	for range 2 {
		select {
		case <-renewed:
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal")
		}
	}
	require.NotContains(t, logs.String(), "renewing claim failed", "a successful renewal is not a failure")

	pool.Close() // every later renewal fails, and not because of the fence
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "renewing claim failed") },
		10*time.Second, 20*time.Millisecond)
}

// The pruner's loop logs what it pruned, and warns about a failed pass,
// each only when it happened.
func TestPrunerRunLogsWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 0)
	b.execution(t, "s", "e", 2, 1, 48*time.Hour)
	logs := &testkit.LogBuffer{}
	p := mustPruner(t, b.pool, &ledger.PrunerConfig{
		Retention: 24 * time.Hour, Interval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	require.NoError(t, p.Start(ctx))
	t.Cleanup(p.Stop)

	// The info line follows the warning check of the same pass.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ledger pruned") }, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, logs.String(), "attempts=2 tool_calls=2")
	require.NotContains(t, logs.String(), "pruning failed", "a pass that pruned did not fail")

	b.pool.Close() // every later pass fails
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "pruning failed") }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "ledger pruned"), "a pass that pruned nothing logs nothing pruned")
}

// OnPruned (the pruned-rows metric) hears of each batch that deleted rows,
// and of no other.
func TestPrunerOnPrunedOnlyAfterDeletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 0)
	b.execution(t, "s", "young", 1, 1, time.Minute)
	var got [][2]int
	p := mustPruner(t, b.pool, &ledger.PrunerConfig{
		Retention: 24 * time.Hour,
		OnPruned:  func(a, c int) { got = append(got, [2]int{a, c}) },
	})
	a, c, err := p.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 0}, [2]int{a, c})
	require.Empty(t, got, "a batch that deleted nothing")

	b.execution(t, "s", "old", 2, 1, 48*time.Hour)
	a, c, err = p.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, [2]int{2, 2}, [2]int{a, c})
	require.Equal(t, [][2]int{{2, 2}}, got)
}

// Renewals keep their beat: the wait after one is the interval less the
// time it took, never less than nothing, so a slow renewal (up to the
// statement timeout) does not push the next one past the lease.
func TestRenewalsKeepTheirBeat(t *testing.T) {
	t.Parallel()
	every := 10 * time.Second
	for _, c := range []struct{ took, want time.Duration }{
		{0, every},
		{3 * time.Millisecond, every - 3*time.Millisecond},
		{every - time.Nanosecond, time.Nanosecond},
		{every, 0},
		{25 * time.Second, 0},
	} {
		require.Equal(t, c.want, ledger.NextRenewal(every, c.took), "took %v", c.took)
	}
}
