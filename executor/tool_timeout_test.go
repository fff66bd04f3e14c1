package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/tools"
)

// stuckTool never returns on its own: with honoursCtx it returns the
// context's error when its context ends, without it it ignores the context
// (as a tool blocked in a system call does) until the test ends.
type stuckTool struct {
	name       string
	class      tools.Class
	honoursCtx bool
	started    chan struct{}
	release    chan struct{}
}

func newStuckTool(t *testing.T, name string, class tools.Class, honoursCtx bool) *stuckTool {
	s := &stuckTool{name: name, class: class, honoursCtx: honoursCtx, started: make(chan struct{}, 16), release: make(chan struct{})}
	return s
}

func (s *stuckTool) Spec() tools.Spec {
	return tools.Spec{Name: s.name, Description: "blocks", InputSchema: json.RawMessage(`{"type":"object"}`), Class: s.class}
}

func (s *stuckTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	s.started <- struct{}{}
	if s.honoursCtx {
		select {
		case <-ctx.Done():
			return tools.Result{}, ctx.Err()
		case <-s.release:
		}
	} else {
		<-s.release
	}
	return tools.Result{Output: "late"}, nil
}

func TestToolTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		*execBundle
		tool   *stuckTool
		exec   *executor.Executor
		nudges *nudgeLog
	}
	setup := func(t *testing.T, class tools.Class, honoursCtx bool, timeout time.Duration) *testBundle {
		t.Helper()
		b := setupExec(t)
		tool := newStuckTool(t, "stuck", class, honoursCtx)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tool))
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		nudges := &nudgeLog{}
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg, ToolTimeout: timeout, StopGrace: 200 * time.Millisecond,
			OnCommitFunc: nudges.onCommit(b)})
		t.Cleanup(e.StopNow)
		// Runs before e.Stop: lets an abandoned call's goroutine end (and,
		// without a bound on tool calls, lets the test fail rather than hang).
		t.Cleanup(func() { close(tool.release) })
		return &testBundle{execBundle: b, tool: tool, exec: e, nudges: nudges}
	}

	// After the deadline the call's outcome is unknown, whether the tool
	// gave up on its context or ignored it, and the turn goes on: the
	// model gets the unknown outcome and answers.
	for _, tc := range []struct {
		name       string
		class      tools.Class
		honoursCtx bool
	}{
		{"SideEffectingHonoursContext", tools.SideEffecting, true},
		{"SideEffectingIgnoresContext", tools.SideEffecting, false},
		{"IdempotentIgnoresContext", tools.Idempotent, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.class, tc.honoursCtx, 300*time.Millisecond)
			b.admit(t, "s", "m1", "/tool stuck {}")
			done, err := b.exec.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'stuck'
				AND state = 'unknown' AND is_error AND output LIKE 'outcome unknown: %tool timeout%'`), "the call is unknown, naming the timeout")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts p JOIN messages m USING (message_id)
				WHERE m.role = 'assistant' AND m.status = 'completed' AND p.kind = 'text' AND p.body LIKE 'tool results: stuck: outcome unknown%'`),
				"the turn went on: the model answered the unknown outcome")
		})
	}

	// The stop's grace bounds the stop even when a tool ignores its
	// context and its own deadline is far away; a tool that honours its
	// context ends with the grace. Either way the call's outcome is unknown.
	for _, honoursCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("StopGraceBoundsAStuckTool/HonoursContext=%v", honoursCtx), func(t *testing.T) {
			t.Parallel()
			b := setup(t, tools.SideEffecting, honoursCtx, time.Hour)
			b.admit(t, "s", "m1", "/tool stuck {}")
			b.admit(t, "s", "m2", "queued") // the stop hands the session on with a wake
			before := b.count(t, `SELECT max(id) FROM outbox`)
			_, err := b.exec.Wake(ctx, "s", 0)
			require.NoError(t, err)
			select {
			case <-b.tool.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the tool never started")
			}
			stopped := make(chan struct{})
			go func() { defer close(stopped); b.exec.Stop() }() // a StopGrace of 200ms
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("Stop waited for a tool that ignores its context, past the grace")
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state = 'unknown'
				AND output = 'outcome unknown: interrupted by shutdown'`), "the abandoned call is unknown, never failed or re-run, and says why")
			// The write after the cancellation (the call settled unknown)
			// nudges the relay as every commit does, before the release's.
			require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventToolCompleted))
			requireNudgedAfterEachCommit(t, b.execBundle, before, b.nudges.get())
		})
	}
}
