package executor_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
)

// goexitProvider ends the goroutine that calls it, once: a test double's
// FailNow does so. Complete runs on the execution's own goroutine, so no
// recover stops it.
type goexitProvider struct{ done atomic.Bool }

func (p *goexitProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	if req.Turn[0].Text == "goexit" && !p.done.Swap(true) {
		runtime.Goexit()
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

// A run whose goroutine ends without returning ends all the same: left in
// the executor's map, it was joined by every later wake of its session,
// whose done never closed, and the session never ran again in this
// process. Its claim is left to expire (phase unknown: recovery
// reconciles), and a later wake after that runs the session.
func TestProviderGoexitEndsTheRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: &goexitProvider{}})
	t.Cleanup(e.StopNow)
	b.admit(t, "s", "m1", "goexit")
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run whose goroutine ended never ended")
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'unknown'`), "its claim is left to expire")
	_, err = b.pool.Exec(ctx, `DELETE FROM claims`) // as recovery leaves it once it decided: no claim
	require.NoError(t, err)
	b.admit(t, "s", "m2", "hello")
	done, err = e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 1, b.answered(t, "m2"), "a later wake ran the session")
}
