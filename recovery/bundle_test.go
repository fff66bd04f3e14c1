package recovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// testBundle builds crash states on a real database through the real write
// paths (admission, claims, the ledger), expires them as a dead process
// would leave them, and runs recovery passes over them.
type testBundle struct {
	pool     *pgxpool.Pool
	url      string // the test database, for pools of other settings
	admitter *admission.Admitter
	claims   *ledger.Claims
	rec      *recovery.Recoverer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, url := testkit.Pool(t)
	return &testBundle{
		pool:     pool,
		url:      url,
		admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{}),
		claims:   ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "dead-process"}),
		rec:      recovery.New(pool, &recovery.Config{Batch: 100, OwnerID: "recovery-test", RedriveAfter: time.Hour}),
	}
}

func (b *testBundle) admit(t *testing.T, session, msg, text string) {
	t.Helper()
	_, err := b.admitter.Admit(context.Background(), []admission.Incoming{{Prompt: envelope.Prompt{
		MessageID: msg, SessionID: session, Text: text, Delivery: envelope.DeliveryQueue}}})
	require.NoError(t, err)
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	return testkit.Count(t, b.pool, sql, args...)
}

// crashed is an execution that died mid-turn: its claim, its promoted
// input, its pending assistant message.
type crashed struct {
	x         *ledger.Execution
	session   string
	input     string
	assistant string
}

// acquire takes the session's claim for execution as the executor does on
// a wake: AcquireWaiting, which claims (phase ready) only when an input
// waits. A process killed right after leaves the claim-ready state.
func (b *testBundle) acquire(t *testing.T, session, execution string) *ledger.Execution {
	t.Helper()
	x, err := b.claims.AcquireWaiting(context.Background(), session, execution, nil)
	require.NoError(t, err)
	return x
}

// startTurn acquires the session's claim and promotes msg into a turn the
// way the executor does (user message, pending assistant message), leaving
// the phase ready.
func (b *testBundle) startTurn(t *testing.T, session, msg string) *crashed {
	t.Helper()
	ctx := context.Background()
	x := b.acquire(t, session, "exec-"+session)
	c := &crashed{x: x, session: session, input: msg, assistant: "asst-" + session}
	require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now() WHERE message_id = $1`, msg); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, completed_at) VALUES ($1, $2, 'user', 'completed', now())`, msg, session); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO message_parts (message_id, idx, kind, body) SELECT $1, 0, 'text', text FROM inputs WHERE message_id = $1`, msg); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, answers, turn_id, execution_id, fencing_token)
			VALUES ($1, $2, 'assistant', 'pending', $3, $1, $4, $5)`, c.assistant, session, []string{msg}, x.Claim().ExecutionID, x.Claim().Token); err != nil {
			return err
		}
		return x.SetPhase(ctx, tx, ledger.PhaseReady, c.assistant)
	}))
	return c
}

// beginAttempt commits a provider attempt's intent (phase unknown).
func (b *testBundle) beginAttempt(t *testing.T, c *crashed, step int, provider string) string {
	t.Helper()
	ctx := context.Background()
	id := ledger.AttemptID(c.x.Claim().ExecutionID, step)
	require.NoError(t, c.x.Write(ctx, func(tx pgx.Tx) error {
		return c.x.BeginAttempt(ctx, tx, ledger.AttemptParams{ID: id, AssistantMessageID: c.assistant, Step: step,
			Provider: provider, IdempotencyKey: id, RequestHash: []byte{1}})
	}))
	return id
}

// toolStep records a response requesting calls (name → class), completes
// the assistant message with its tool_call parts, and sets phase continue.
func (b *testBundle) toolStep(t *testing.T, c *crashed, attemptID string, calls map[string]string, inputs map[string]string) []ledger.CallParams {
	t.Helper()
	ctx := context.Background()
	var params []ledger.CallParams
	i := 0
	for _, name := range []string{"echo", "append_line", "other"} {
		class, ok := calls[name]
		if !ok {
			continue
		}
		params = append(params, ledger.CallParams{ID: fmt.Sprintf("%s/call-%d", attemptID, i), AttemptID: attemptID, Index: i,
			ModelCallID: fmt.Sprintf("call-%d", i), Tool: name, Class: class, Input: json.RawMessage(inputs[name]),
			IdempotencyKey: fmt.Sprintf("%s/call-%d", attemptID, i)})
		i++
	}
	parts := make([]string, len(params))
	for i, p := range params {
		body, _ := json.Marshal(map[string]any{"id": p.ModelCallID, "name": p.Tool, "input": p.Input})
		parts[i] = string(body)
	}
	require.NoError(t, c.x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseContinue, c.assistant,
		ledger.StepCallsCall(attemptID, 1, 1, "", c.assistant, "", parts, params, ledger.Events{}), nil))
	return params
}

func (b *testBundle) startCall(t *testing.T, c *crashed, p ledger.CallParams) {
	t.Helper()
	require.NoError(t, c.x.WriteCallRetried(context.Background(), ledger.RetryOpts{}, ledger.PhaseUnknown, "",
		ledger.CallStartCall(p.ID, ledger.Events{}), nil))
}

func (b *testBundle) settleCall(t *testing.T, c *crashed, p ledger.CallParams, output string) {
	t.Helper()
	require.NoError(t, c.x.WriteCallRetried(context.Background(), ledger.RetryOpts{}, "", "",
		ledger.CallSettleCall(p.ID, p.AttemptID, ledger.CallSucceeded, output, false, p.ModelCallID, ledger.Events{}), nil))
}

// die leaves the claim as a killed process does: its lease runs out.
func (b *testBundle) die(t *testing.T, session string) {
	b.exec(t, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = $1`, session)
}

func (b *testBundle) pass(t *testing.T) recovery.Pass {
	t.Helper()
	p, err := b.rec.RunOnce(context.Background())
	require.NoError(t, err)
	return p
}

func (b *testBundle) records(t *testing.T, session string) []recovery.Record {
	t.Helper()
	recs, err := recovery.Records(context.Background(), b.pool, session)
	require.NoError(t, err)
	return recs
}

func (b *testBundle) wakes(t *testing.T, session string) int {
	return b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1`, session)
}

// run wakes an executor on the session and waits until it is idle.
func (b *testBundle) run(t *testing.T, provider provider.Provider, reg *tools.Registry, session string) {
	t.Helper()
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "new-process"})
	e, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims, Provider: provider, Tools: reg})
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	defer e.StopNow()
	done, err := e.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not go idle")
	}
}

// recorder is the scripted provider, remembering requests.
type recorder struct {
	mu   sync.Mutex
	reqs []provider.Request
}

func (r *recorder) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

func (r *recorder) all() []provider.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]provider.Request(nil), r.reqs...)
}

// keyTool is an idempotent tool that counts runs per idempotency key.
type keyTool struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyTool) Spec() tools.Spec {
	return tools.Spec{Name: "echo", Class: tools.Idempotent, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (k *keyTool) Run(_ context.Context, c tools.Call) (tools.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, c.IdempotencyKey)
	return tools.Result{Output: "ran"}, nil
}
