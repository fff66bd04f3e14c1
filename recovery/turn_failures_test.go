package recovery_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// stallingSideTool is the side-effecting append_line whose run signals that
// it began (its intent is committed) and then blocks until released.
type stallingSideTool struct {
	began   chan struct{}
	release chan struct{}
}

func (s *stallingSideTool) Spec() tools.Spec {
	return tools.Spec{Name: "append_line", Class: tools.SideEffecting, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (s *stallingSideTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	close(s.began)
	<-s.release
	return tools.Result{Output: "appended"}, nil
}

// crashDuringCall wakes a real executor on the session; once it is inside
// the side-effecting call (intent committed, phase unknown), the claim's
// lease runs out as a killed process's does and the executor is stopped:
// the call is left started, as after a crash in window tool-ran.
func (b *testBundle) crashDuringCall(t *testing.T, session string) {
	t.Helper()
	tool := &stallingSideTool{began: make(chan struct{}), release: make(chan struct{})}
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "crashing-process"})
	e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims, Provider: &recorder{}, Tools: b.registry(t, tool)})
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	_, err = e.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	select {
	case <-tool.began:
	case <-time.After(20 * time.Second):
		t.Fatal("the call never began")
	}
	b.die(t, session)
	close(tool.release) // its result is fenced: the lease is gone
	e.StopNow()
}

// A resolution's continuation continues the turn with its claim pointing
// at the target's assistant message M until it begins a step of its own.
// When such a continuation dies inside the re-run call, recovery reconciles
// it and creates the errored message "recovery-failed <exec>", newer than
// M (M is the step that asked for the call: answered, and named by no
// failure). The operator resolves
// the call's round 2; its continuation again points its claim at M and
// again dies inside the call. That errored message is the rest of the same
// turn, not a newer turn: the third failure must be reconciled like the
// second (the call unknown, a turn.failed of its own, round 3 resolvable),
// not taken for a superseded claim that leaves the side-effecting call
// started for good (P4, invariant 12).
func TestThirdFailureOfATurnIsReconciledNotSuperseded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, call := b.unknownCall(t, "s") // first failure: reconciled, names M

	_, err := b.resolve(t, "s", call.ID, recovery.FindingDidNotRun, "")
	require.NoError(t, err)
	b.crashDuringCall(t, "s") // the round 1 continuation dies inside the call
	p := b.pass(t)
	require.Equal(t, 1, p.Decisions[recovery.DecisionReconciled], "second failure: reconciled")
	// Each failure names an errored message of its own: M, the step
	// that asked for the call, stays completed.
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM messages WHERE message_id LIKE 'recovery-failed %' AND status = 'errored'`))

	_, err = b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 2)
	require.NoError(t, err)
	b.crashDuringCall(t, "s") // the round 2 continuation dies inside the call
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'started'`, call.ID))
	p = b.pass(t)
	t.Logf("third failure decided: %v", p.Decisions)
	var state string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT state FROM tool_calls WHERE call_id = $1`, call.ID).Scan(&state))
	require.Equal(t, "unknown", state, "a side-effecting call that may have run is left %q, never reported unknown", state)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionReconciled: 1}, p.Decisions)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'
		AND convert_from(payload, 'UTF8') LIKE '%"turn.failed"%'`), "each of the three failures has its turn.failed")
	_, err = b.resolveRound(t, "s", call.ID, recovery.FindingDidNotRun, 3)
	require.NoError(t, err, "the third round is the operator's to resolve")
}
