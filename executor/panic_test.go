package executor_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// panickyTool panics on every run, as a tool with a bug on some model
// input would: with value when it is set, else by assigning to a nil map.
type panickyTool struct {
	class tools.Class
	value any
	runs  atomic.Int32
}

func (p *panickyTool) Spec() tools.Spec {
	return tools.Spec{Name: "panicky", Description: "panics", InputSchema: json.RawMessage(`{"type":"object"}`), Class: p.class}
}

func (p *panickyTool) Run(context.Context, tools.Call) (tools.Result, error) {
	p.runs.Add(1)
	if p.value != nil {
		panic(p.value)
	}
	var m map[string]int
	//lint:ignore SA5000 the runtime's own panic is the point: assignment to entry in nil map
	m["boom"]++
	return tools.Result{}, nil
}

// TestToolPanicSettlesTheCall: a tool's panic is bad data (the model chose
// the input), not a crash. It happened after the call's dispatch, so the
// call is settled unknown, whatever its class: it may have had effects,
// and an idempotent one run again would panic again. The turn goes on (the
// model sees the unknown outcome), the tool ran once, and the process goes
// on serving other sessions. The recorded text says "panic", with the
// panic's value redacted and bounded as a tool's error is.
func TestToolPanicSettlesTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		class tools.Class
		value any
		want  string // LIKE pattern of the call's output
	}{
		{"SideEffecting", tools.SideEffecting, nil, "outcome unknown: the tool panicked: assignment to entry in nil map"},
		{"Idempotent", tools.Idempotent, nil, "outcome unknown: the tool panicked: assignment to entry in nil map"},
		{"ValueRedacted", tools.SideEffecting, `Post "https://u:hunter2@hooks.internal/x?token=t0ken": boom`,
			`outcome unknown: the tool panicked: Post "https://u:****@hooks.internal/x?token=****": boom`},
		{"ValueBounded", tools.SideEffecting, strings.Repeat("x", 100_000), "outcome unknown: the tool panicked: xxx%…[truncated]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			tool := &panickyTool{class: tc.class, value: tc.value}
			reg := tools.NewRegistry()
			require.NoError(t, reg.Register(tool))
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
			var logs testkit.LogBuffer
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg, Logger: testkit.Logger(t, &logs)})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", "/tool panicky {}")
			done, err := e.Wake(ctx, "s", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'panicky'
				AND state = 'unknown' AND is_error AND output LIKE $1 AND length(output) < 1200`, tc.want), "the call is unknown, naming the panic")
			require.Equal(t, int32(1), tool.runs.Load(), "never run again")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts p JOIN messages m USING (message_id)
				WHERE m.role = 'assistant' AND m.status = 'completed' AND p.kind = 'text' AND p.body LIKE 'tool results: panicky: outcome unknown: the tool panicked: %'`),
				"the turn went on: the model answered the unknown outcome")
			for _, secret := range []string{"hunter2", "t0ken"} {
				require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE output LIKE '%' || $1 || '%'`, secret), secret)
				require.Zero(t, b.count(t, `SELECT count(*) FROM message_parts WHERE body LIKE '%' || $1 || '%'`, secret), secret)
			}
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
			require.Contains(t, logs.String(), `level=ERROR msg="tool panicked; the call's outcome is unknown"`)
			require.Contains(t, logs.String(), "panic_test.go", "the stack is logged")
			require.NotContains(t, logs.String(), "hunter2")

			// The process is alive: another session's turn runs.
			b.admit(t, "s2", "m2", "hello")
			done, err = e.Wake(ctx, "s2", 0)
			require.NoError(t, err)
			wait(t, done)
			require.Equal(t, 1, b.answered(t, "m2"))
		})
	}
}

// panickyProvider panics on a prompt "panic" (its first panics tries;
// every try when panics is negative), and otherwise answers as the
// scripted provider does.
type panickyProvider struct {
	panics     int32
	idempotent bool
	tries      atomic.Int32
}

func (p *panickyProvider) HonoursIdempotencyKeys() bool { return p.idempotent }

func (p *panickyProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	if req.Turn[0].Text == "panic" && (p.panics < 0 || p.tries.Add(1) <= p.panics) {
		var s []int
		_ = s[len(req.Turn)+2] // index out of range
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

// TestProviderPanicIsAnUnknownAttempt: a provider's panic comes after the
// attempt's intent, while the request may have been sent: the attempt is
// recorded unknown, as after a dropped connection, and the turn fails
// with outcome_unknown (a provider that honours idempotency keys sends
// the step again under its key instead). The process goes on serving
// other sessions.
func TestProviderPanicIsAnUnknownAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func(t *testing.T, p *panickyProvider) *execBundle {
		b := setupExec(t)
		var logs testkit.LogBuffer
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, Logger: testkit.Logger(t, &logs)})
		t.Cleanup(e.StopNow)
		b.admit(t, "s", "m1", "panic")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
		require.Contains(t, logs.String(), `level=ERROR msg="provider panicked; the attempt's outcome is unknown"`)
		require.Contains(t, logs.String(), "panic_test.go", "the stack is logged")

		b.admit(t, "s2", "m2", "hello")
		done, err = e.Wake(ctx, "s2", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m2"), "the process is alive: another session's turn runs")
		return b
	}

	t.Run("OutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		b := run(t, &panickyProvider{panics: -1})
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'unknown'
			AND error LIKE 'outcome unknown: the provider panicked: runtime error: index out of range%'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE session_id = 's' AND role = 'assistant' AND status = 'errored'`))
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, envelope.FailOutcomeUnknown, failed[0].Reason)
		require.Contains(t, failed[0].Error, "panic")
	})

	t.Run("IdempotentProviderSendsAgain", func(t *testing.T) {
		t.Parallel()
		b := run(t, &panickyProvider{panics: 1, idempotent: true})
		require.Equal(t, 1, b.answered(t, "m1"))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'succeeded' AND tries = 2`))
	})
}

// classPanickyTool declares itself idempotent and resolves its class from
// the input (tools.ClassResolver), panicking on every input, as a
// resolver with a bug on some model input would.
type classPanickyTool struct{ runs atomic.Int32 }

func (*classPanickyTool) Spec() tools.Spec {
	return tools.Spec{Name: "classy", Description: "panics resolving its class", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.Idempotent}
}

func (*classPanickyTool) ClassOf(json.RawMessage) tools.Class {
	var m map[string]tools.Class
	//lint:ignore SA5000 the runtime's own panic is the point: assignment to entry in nil map
	m["x"] = tools.Idempotent
	return m["x"]
}

func (c *classPanickyTool) Run(context.Context, tools.Call) (tools.Result, error) {
	c.runs.Add(1)
	return tools.Result{Output: "ran"}, nil
}

// TestToolClassPanicIsSideEffecting: a tool's class resolver reads the
// model's input, before anything is dispatched. A panic in it is bad
// data, not a crash (it took the process and every session it ran
// mid-turn): the call's class is the one that never repeats an effect,
// the call is recorded so and runs, and the process goes on.
func TestToolClassPanicIsSideEffecting(t *testing.T) {
	t.Parallel()
	tool := &classPanickyTool{}
	b, e, logs := classToolExecutor(t, tool, 0)
	wait(t, toolTurn(t, b, e, "s", "m1", "/tool classy {}"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'classy'
		AND class = 'side_effecting' AND state = 'succeeded' AND output = 'ran'`), "recorded side-effecting, and run")
	require.Equal(t, int32(1), tool.runs.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts p JOIN messages m USING (message_id)
		WHERE m.role = 'assistant' AND m.status = 'completed' AND p.kind = 'text' AND p.body = 'tool results: classy: ran'`),
		"the turn went on: the model answered the call's output")
	require.Contains(t, logs.String(), `level=ERROR msg="tool class resolver panicked; the call counts as side-effecting"`)
	require.Contains(t, logs.String(), "panic_test.go", "the stack is logged")
}

// classGoexitTool resolves its class from the input and ends the
// goroutine that asks (runtime.Goexit, as a test double's FailNow does),
// once.
type classGoexitTool struct {
	done atomic.Bool
	runs atomic.Int32
}

func (*classGoexitTool) Spec() tools.Spec {
	return tools.Spec{Name: "classexit", Description: "ends its goroutine resolving its class", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.Idempotent}
}

func (c *classGoexitTool) ClassOf(json.RawMessage) tools.Class {
	if !c.done.Swap(true) {
		runtime.Goexit()
	}
	return tools.Idempotent
}

func (c *classGoexitTool) Run(context.Context, tools.Call) (tools.Result, error) {
	c.runs.Add(1)
	return tools.Result{Output: "ran"}, nil
}

// TestToolClassGoexitIsSideEffecting: a class resolver that ends its
// goroutine without returning is handled as one that panics, as a tool's
// Run is (runTool): the call counts as side-effecting, and the provider's
// answer in hand is recorded (it was left started, for recovery to call
// the turn's outcome unknown).
func TestToolClassGoexitIsSideEffecting(t *testing.T) {
	t.Parallel()
	tool := &classGoexitTool{}
	b, e, _ := classToolExecutor(t, tool, 0)
	wait(t, toolTurn(t, b, e, "s", "m1", "/tool classexit {}"))
	require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'started'`),
		"the provider's answer is recorded, not left started")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'classexit'
		AND class = 'side_effecting' AND state = 'succeeded'`))
	require.Equal(t, int32(1), tool.runs.Load())
}

// lockedClassTool resolves its class under a lock of its own and, on an
// input it cannot read, panics before it unlocks: a resolver with a bug.
type lockedClassTool struct{ mu sync.Mutex }

func (*lockedClassTool) Spec() tools.Spec {
	return tools.Spec{Name: "lockedclass", Description: "locks to resolve its class", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.Idempotent}
}

func (l *lockedClassTool) ClassOf(in json.RawMessage) tools.Class {
	l.mu.Lock()
	var v struct{ Boom bool }
	_ = json.Unmarshal(in, &v)
	if v.Boom {
		panic("cannot read the input")
	}
	l.mu.Unlock()
	return tools.Idempotent
}

func (*lockedClassTool) Run(context.Context, tools.Call) (tools.Result, error) {
	return tools.Result{Output: "ran"}, nil
}

// TestToolClassResolverThatNeverAnswers: once a resolver panicked with
// its lock held, the next call of the tool waits in it for good. The call
// must not: abandoned after the tool timeout, it counts as
// side-effecting and runs, and the turn goes on (waiting, its session
// kept its claim renewed and a hard stop waited for it).
func TestToolClassResolverThatNeverAnswers(t *testing.T) {
	t.Parallel()
	tool := &lockedClassTool{}
	b, e, logs := classToolExecutor(t, tool, 500*time.Millisecond)
	wait(t, toolTurn(t, b, e, "s1", "m1", `/tool lockedclass {"Boom": true}`))
	t.Cleanup(tool.mu.Unlock) // the lock the panic left held: lets the abandoned resolver end
	done := toolTurn(t, b, e, "s2", "m2", `/tool lockedclass {}`)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the second session never finished its turn: its class resolver waits for the lock the panic left held")
	}
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM tool_calls WHERE tool = 'lockedclass' AND class = 'side_effecting' AND state = 'succeeded'`),
		"both calls side-effecting (a panic, then no answer), and run")
	require.Contains(t, logs.String(), `msg="tool class resolver did not answer; the call counts as side-effecting"`)
}

// classToolExecutor is an executor whose registry holds tool alone, its
// log in the returned buffer; toolTurn admits text in session and waits
// for its execution to end.
func classToolExecutor(t *testing.T, tool tools.Tool, toolTimeout time.Duration) (*execBundle, *executor.Executor, *testkit.LogBuffer) {
	b := setupExec(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tool))
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	var logs testkit.LogBuffer
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg, ToolTimeout: toolTimeout, Logger: testkit.Logger(t, &logs)})
	t.Cleanup(e.StopNow)
	return b, e, &logs
}

func toolTurn(t *testing.T, b *execBundle, e *executor.Executor, session, messageID, text string) <-chan struct{} {
	b.admit(t, session, messageID, text)
	done, err := e.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	return done
}
