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

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
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
			b := setupExec(t)
			reg := tools.NewRegistry()
			require.NoError(t, reg.Register(outcomeTool{}))
			var mu sync.Mutex
			var runs, settled []string
			b.runPrompt(t, &executor.ExecutorConfig{Tools: reg,
				OnToolRunFunc:     func(o string, _ time.Duration) { mu.Lock(); runs = append(runs, o); mu.Unlock() },
				OnCallSettledFunc: func(o string) { mu.Lock(); settled = append(settled, o); mu.Unlock() }}, fmt.Sprintf(`/tool outcome {"do": %q}`, c.do))
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = $1`, string(c.state)))
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []string{c.outcome}, runs)
			require.Equal(t, []string{c.outcome}, settled)
		})
	}
}

// notRunTool waits for its context to end, then, a moment later (20 ms,
// well within the moment a tool has before it is abandoned), says that it
// did nothing (tools.ErrNotRun), as a tool that checks its deadline
// before acting does.
type notRunTool struct{}

func (notRunTool) Spec() tools.Spec {
	return tools.Spec{Name: "late", Description: "gives up", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (notRunTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	<-ctx.Done()
	<-time.After(20 * time.Millisecond) // answering after its deadline, not at it
	return tools.Result{}, fmt.Errorf("gave up before acting: %w", tools.ErrNotRun)
}

// A tool that answers once its deadline passed is heard (it has a moment
// before it is abandoned): one that says it did nothing fails the call,
// which is not left unknown.
func TestToolHeardAfterItsDeadline(t *testing.T) {
	t.Parallel()
	b := setupExec(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(notRunTool{}))
	b.runPrompt(t, &executor.ExecutorConfig{Tools: reg, ToolTimeout: 100 * time.Millisecond}, `/tool late {}`)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'failed' AND output LIKE 'not run: %gave up before acting%'`))
}

// thinkingProvider answers its first step with text and a tool call
// together, as real models do, and its second with text; it keeps the
// requests.
type thinkingProvider struct {
	mu   sync.Mutex
	reqs []provider.Request
}

func (p *thinkingProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, req)
	if len(p.reqs) == 1 {
		return provider.Response{Text: "let me look", ToolCalls: []provider.ToolCall{{ID: "c1", Name: "outcome", Input: json.RawMessage(`{"do": "ok"}`)}}}, nil
	}
	return provider.Response{Text: "found it"}, nil
}

// A step that answers with text and tool calls keeps both, in order (the
// text first, then the calls), and the next step's request carries both.
func TestTextWithToolCallsIsKept(t *testing.T) {
	t.Parallel()
	b := setupExec(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(outcomeTool{}))
	p := &thinkingProvider{}
	b.runPrompt(t, &executor.ExecutorConfig{Tools: reg, Provider: p}, "look it up")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnCompleted))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts WHERE idx = 0 AND kind = 'text' AND body = 'let me look'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts WHERE idx = 1 AND kind = 'tool_call' AND body LIKE '%"c1"%'`))
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Len(t, p.reqs, 2)
	var asked *provider.TranscriptMessage
	for i, m := range p.reqs[1].Messages {
		if m.Role == "assistant" && len(m.ToolCalls) > 0 {
			asked = &p.reqs[1].Messages[i]
		}
	}
	require.NotNil(t, asked, "the second step's request carries the first step's answer")
	require.Equal(t, "let me look", asked.Text)
	require.Equal(t, "c1", asked.ToolCalls[0].ID)
}

// againProvider fails its first request with first, then answers; it
// keeps the idempotency keys it was sent, and says whether it honours
// them.
type againProvider struct {
	first   error
	honours bool
	mu      sync.Mutex
	keys    []string
}

func (p *againProvider) HonoursIdempotencyKeys() bool { return p.honours }

func (p *againProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = append(p.keys, req.IdempotencyKey)
	if len(p.keys) == 1 {
		return provider.Response{}, p.first
	}
	return provider.Response{Text: "ok"}, nil
}

// A failed step is sent again, under the same attempt and key, 200 ms
// later, when the request certainly was not acted on (provider.ErrNotSent,
// any provider), or when the provider honours idempotency keys (whatever
// the error: it answers the retry from what it did with the first). A
// provider that does not honour them fails the turn on any other error
// (the ProviderFails case of TestIdleReleaseWritesNoWake).
func TestFailedStepIsSentAgainWithItsKey(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]*againProvider{
		"NotSent":            {first: fmt.Errorf("dial: %w", provider.ErrNotSent)},
		"IdempotentProvider": {first: errors.New("connection reset by peer"), honours: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			var logs testkit.LogBuffer
			b.runPrompt(t, &executor.ExecutorConfig{Provider: p, Logger: testkit.Logger(t, &logs)}, "hello")
			require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventTurnCompleted))
			require.Contains(t, logs.String(), `msg="provider attempt will be retried"`)
			require.Contains(t, logs.String(), "after=200ms", "the wait before the step is sent again")
			p.mu.Lock()
			defer p.mu.Unlock()
			require.Len(t, p.keys, 2)
			require.NotEmpty(t, p.keys[0])
			require.Equal(t, p.keys[0], p.keys[1], "the same key")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'succeeded' AND tries = 2`), "one attempt, sent twice")
		})
	}
}

// runPrompt admits text as prompt m1 of session s, runs it on an executor
// of cfg (its Claims set here, a lease of 5 s) until the session is idle.
func (b *execBundle) runPrompt(t *testing.T, cfg *executor.ExecutorConfig, text string) {
	t.Helper()
	cfg.Claims = ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, cfg)
	t.Cleanup(e.StopNow)
	b.admit(t, "s", "m1", text)
	done, err := e.Wake(context.Background(), "s", 0)
	require.NoError(t, err)
	wait(t, done)
}

// alwaysProvider answers the requests with errs in turn, the last one
// from then on.
type alwaysProvider struct {
	errs    []error
	honours bool
	mu      sync.Mutex
	sent    int
}

func (p *alwaysProvider) HonoursIdempotencyKeys() bool { return p.honours }

func (p *alwaysProvider) Complete(context.Context, provider.Request) (provider.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent++
	return provider.Response{}, p.errs[min(p.sent, len(p.errs))-1]
}

// A provider that honours idempotency keys gets an uncertain step again,
// under its key, a few times; when the last try is uncertain too, the
// attempt may have been acted on (and billed): it is unknown, and the
// turn fails with outcome_unknown, never as a plain failure that the
// spend at risk and an operator's resolve would not see. A step that
// certainly was not sent fails plainly.
func TestRetriesEndingUncertainLeaveTheAttemptUnknown(t *testing.T) {
	t.Parallel()
	uncertain := fmt.Errorf("reset: %w", provider.ErrOutcomeUnknown)
	for name, tc := range map[string]struct {
		p            *alwaysProvider
		sent         int
		state, error string
	}{
		"Uncertain": {&alwaysProvider{errs: []error{uncertain}, honours: true}, 6, "unknown", envelope.FailOutcomeUnknown},
		// A refusal of the retry says nothing of the first try.
		"UncertainThenRefused": {&alwaysProvider{errs: []error{uncertain, fmt.Errorf("401: %w", provider.ErrRejected)}, honours: true},
			2, "unknown", envelope.FailOutcomeUnknown},
		"UncertainThenRetriesRunOut": {&alwaysProvider{errs: []error{uncertain, &provider.RetryAfterError{After: time.Millisecond, Err: errors.New("429")}}, honours: true},
			6, "unknown", envelope.FailOutcomeUnknown},
		"NotSent": {&alwaysProvider{errs: []error{fmt.Errorf("dial: %w", provider.ErrNotSent)}}, 6, "failed", envelope.FailProviderError},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			b.runPrompt(t, &executor.ExecutorConfig{Provider: tc.p}, "hello")
			tc.p.mu.Lock()
			require.Equal(t, tc.sent, tc.p.sent)
			tc.p.mu.Unlock()
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = $1`, tc.state))
			failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
			require.Len(t, failed, 1)
			require.Equal(t, tc.error, failed[0].Reason)
		})
	}
}
