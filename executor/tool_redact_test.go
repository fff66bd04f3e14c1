package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/tools"
)

// leakyTool fails with an error naming a URL with its secrets, as a tool
// wrapping net/http's *url.Error does.
type leakyTool struct{ notRun bool }

func (leakyTool) Spec() tools.Spec {
	return tools.Spec{Name: "leaky", Description: "fails", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (l leakyTool) Run(context.Context, tools.Call) (tools.Result, error) {
	err := errors.New(`Post "https://u:hunter2@hooks.internal/x?token=t0ken": connection reset`)
	if l.notRun {
		return tools.Result{}, errors.Join(tools.ErrNotRun, err)
	}
	return tools.Result{}, err
}

// TestToolErrorsHideURLSecrets: a tool's error text is stored as the
// call's output and the tool message, and goes to the model: the URL in
// it keeps no secret.
func TestToolErrorsHideURLSecrets(t *testing.T) {
	t.Parallel()
	for _, notRun := range []bool{false, true} {
		b := setupExec(t)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(leakyTool{notRun: notRun}))
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg})
		t.Cleanup(e.StopNow)
		b.admit(t, "s", "m1", "/tool leaky {}")
		done, err := e.Wake(context.Background(), "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND output LIKE '%token=****%'`), "notRun %t", notRun)
		for _, secret := range []string{"hunter2", "t0ken"} {
			require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE output LIKE '%' || $1 || '%'`, secret), secret)
			require.Zero(t, b.count(t, `SELECT count(*) FROM message_parts WHERE body LIKE '%' || $1 || '%'`, secret), secret)
			require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE convert_from(payload, 'UTF8') LIKE '%' || $1 || '%'`, secret), secret)
		}
	}
}
