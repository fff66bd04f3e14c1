package executor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// phaseLog records the phases an execution sets, in order.
type phaseLog struct {
	mu     sync.Mutex
	phases []ledger.Phase
}

func (l *phaseLog) add(_ ledger.Claim, p ledger.Phase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.phases); n == 0 || l.phases[n-1] != p {
		l.phases = append(l.phases, p)
	}
}

func (l *phaseLog) get() []ledger.Phase {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ledger.Phase(nil), l.phases...)
}

func TestLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TurnWithTwoToolCallsAndAFollowUp", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		dir := t.TempDir()
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		require.NoError(t, reg.Register(tools.NewAppendLine(dir)))
		phases := &phaseLog{}
		rec := &recordingScripted{}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a", OnPhaseFunc: phases.add})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: rec, Tools: reg})
		t.Cleanup(e.StopNow)

		b.admit(t, "s", "m1", "/tool echo {\"text\": \"hi\"}\n/tool append_line {\"file\": \"log.txt\", \"line\": \"one\"}")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)

		// Ledger: two attempts (tool step, answer step), both succeeded;
		// two calls with their classes, both succeeded.
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'succeeded'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'echo' AND class = 'idempotent' AND state = 'succeeded' AND output = 'hi'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'append_line' AND class = 'side_effecting' AND state = 'succeeded'`))
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM tool_calls WHERE idempotency_key = '' OR fencing_token <> 1`))
		require.Equal(t, []ledger.Phase{ledger.PhaseUnknown, ledger.PhaseContinue, ledger.PhaseUnknown, ledger.PhaseContinue,
			ledger.PhaseUnknown, ledger.PhaseContinue, ledger.PhaseUnknown, ledger.PhaseSafe}, phases.get(),
			"unknown from the claim on (committed with the promotion and the first attempt), and while each call is in flight; continue when each is settled; safe at the answer")

		// The answer step saw both results, each after its call.
		step2 := rec.request(1)
		n := len(step2.Messages)
		require.Equal(t, "tool", step2.Messages[n-1].Role)
		require.Equal(t, "tool", step2.Messages[n-2].Role)
		require.Len(t, step2.Messages[n-3].ToolCalls, 2)
		require.Equal(t, "hi", step2.Messages[n-2].Text)
		require.Equal(t, step2.IdempotencyKey, step2.AttemptID)
		require.NotEqual(t, rec.request(0).IdempotencyKey, step2.IdempotencyKey, "each step has its own key")

		b.admit(t, "s", "m2", "and now?")
		done, err = e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m2"))
		// The follow-up sees the whole transcript, tool calls included.
		last := rec.request(2)
		require.Equal(t, []string{"user", "assistant", "tool", "tool", "assistant", "user"}, roles(last.Messages))

		data, err := os.ReadFile(filepath.Join(dir, "log.txt"))
		require.NoError(t, err)
		require.Equal(t, "one\n", string(data), "exactly one appended line")
	})

	// Two queued prompts run as two turns under one claim: the second
	// turn's first step begins after the promotion, and is keyed by its
	// own attempt, as every step is.
	t.Run("EachStepIsKeyedByItsAttempt", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		rec := &recordingScripted{}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: rec})
		t.Cleanup(e.StopNow)
		b.admit(t, "s", "m1", "first")
		b.admit(t, "s", "m2", "second")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m1"))
		require.Equal(t, 1, b.answered(t, "m2"))
		first, second := rec.request(0), rec.request(1)
		require.Equal(t, first.AttemptID, first.IdempotencyKey)
		require.Equal(t, second.AttemptID, second.IdempotencyKey)
		require.NotEqual(t, first.IdempotencyKey, second.IdempotencyKey)
	})

	t.Run("InvalidToolInputIsAFailedCallReturnedToTheModel", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		e := b.executor(t, "a", scripted.ScriptedProvider{}, 5*time.Second, 0)
		_ = e
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{OwnerID: "b"})
		e2 := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Tools: reg})
		t.Cleanup(e2.StopNow)
		b.admit(t, "s", "m1", "/tool echo {\"wrong\": 1}\n/tool nosuch {}")
		done, err := e2.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state = 'failed' AND started_at IS NULL`),
			"never dispatched")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE tool = 'nosuch' AND class = 'side_effecting'`),
			"an unknown tool counts as side-effecting")
		var text string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT body FROM message_parts p JOIN messages m USING (message_id)
			WHERE m.role = 'assistant' AND m.status = 'completed' AND p.kind = 'text'`).Scan(&text))
		require.Contains(t, text, "invalid tool call")
	})
}

// recordingScripted is the scripted provider, remembering each request.
type recordingScripted struct {
	mu   sync.Mutex
	reqs []provider.Request
}

func (r *recordingScripted) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

func (r *recordingScripted) request(i int) provider.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[i]
}

func roles(ms []provider.TranscriptMessage) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Role)
	}
	return out
}

var _ = strings.Contains
var _ = envelope.EventTurnCompleted
