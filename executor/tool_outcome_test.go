package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/tools"
)

// outcomeTool ends each call as its input says: {"do": "ok"} succeeds,
// "error" is a result the tool marks as an error, "notrun" is an error
// saying the tool did nothing (tools.ErrNotRun), "fail" any other error.
type outcomeTool struct{}

func (outcomeTool) Spec() tools.Spec {
	return tools.Spec{Name: "outcome", Description: "ends as told", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (outcomeTool) Run(_ context.Context, c tools.Call) (tools.Result, error) {
	var in struct{ Do string }
	if err := json.Unmarshal(c.Input, &in); err != nil {
		return tools.Result{}, err
	}
	switch in.Do {
	case "error":
		return tools.Result{Output: "refused", IsError: true}, nil
	case "notrun":
		return tools.Result{}, fmt.Errorf("no sandbox: %w", tools.ErrNotRun)
	case "fail":
		return tools.Result{}, errors.New("connection reset")
	}
	return tools.Result{Output: "done"}, nil
}

// Each way a tool run can end is counted by the outcome the ledger
// records, in both metrics' callbacks: the run's (OnToolRunFunc) and the
// settled call's (OnCallSettledFunc), once each.
func TestToolOutcomes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		do, outcome string
		state       ledger.CallState
	}{
		{"ok", executor.OutcomeSucceeded, ledger.CallSucceeded},
		{"error", executor.OutcomeFailed, ledger.CallFailed},
		{"notrun", executor.OutcomeFailed, ledger.CallFailed},
		{"fail", executor.OutcomeUnknown, ledger.CallUnknown},
	} {
		t.Run(c.do, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setupExec(t)
			reg := tools.NewRegistry()
			require.NoError(t, reg.Register(outcomeTool{}))
			var mu sync.Mutex
			var runs, settled []string
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg,
				OnToolRunFunc:     func(o string, _ time.Duration) { mu.Lock(); runs = append(runs, o); mu.Unlock() },
				OnCallSettledFunc: func(o string) { mu.Lock(); settled = append(settled, o); mu.Unlock() }})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", fmt.Sprintf(`/tool outcome {"do": %q}`, c.do))
			done, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = $1`, string(c.state)))
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []string{c.outcome}, runs)
			require.Equal(t, []string{c.outcome}, settled)
		})
	}
}

// notRunTool waits for its context to end, then says that it did nothing
// (tools.ErrNotRun), as a tool that checks its deadline before acting does.
type notRunTool struct{}

func (notRunTool) Spec() tools.Spec {
	return tools.Spec{Name: "late", Description: "gives up", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (notRunTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	<-ctx.Done()
	return tools.Result{}, fmt.Errorf("gave up before acting: %w", tools.ErrNotRun)
}

// A tool that answers once its deadline passed is heard (it has a moment
// before it is abandoned): one that says it did nothing fails the call,
// which is not left unknown.
func TestToolHeardAfterItsDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(notRunTool{}))
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg, ToolTimeout: 100 * time.Millisecond})
	t.Cleanup(e.StopNow)
	b.admit(t, "s", "m1", `/tool late {}`)
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'failed' AND output LIKE 'not run: %gave up before acting%'`))
}
