package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// spendProvider is the scripted provider under a model name, reporting a
// response ID per attempt ("resp/<attempt ID>") before it answers, as a
// real provider's headers would, then holding the step until hold
// returns.
type spendProvider struct {
	hold func(req provider.Request)

	mu   sync.Mutex
	reqs []provider.Request
}

func (p *spendProvider) ModelName() string { return "model-x" }

func (p *spendProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	req.ResponseIDFunc("resp/" + req.AttemptID)
	req.ResponseIDFunc("a later ID is not recorded")
	if p.hold != nil {
		p.hold(req)
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

func (p *spendProvider) requests() []provider.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]provider.Request(nil), p.reqs...)
}

// estimate is the executor's documented estimate of a request's input
// tokens: its JSON bytes / 4, rounded up.
func estimate(t *testing.T, req provider.Request) int64 {
	b, err := json.Marshal(req)
	assert.NoError(t, err)
	return (int64(len(b)) + 3) / 4
}

func TestAttemptSpend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ModelEstimateAndResponseIDAreRecordedAsEarlyAsKnown", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		p := &spendProvider{}
		// While each step is in flight, its intent already holds the model
		// and the estimate, and the response ID arrives before the answer.
		// (hold runs on the executor's goroutine: assert, not require.)
		p.hold = func(req provider.Request) {
			assert.Eventually(t, func() bool {
				var n int
				err := b.pool.QueryRow(ctx, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'started'
					AND model = 'model-x' AND request_tokens = $2 AND response_id = $3 AND response_id_at IS NOT NULL`,
					req.AttemptID, estimate(t, req), "resp/"+req.AttemptID).Scan(&n)
				return err == nil && n == 1
			}, 10*time.Second, 5*time.Millisecond, "attempt %s in flight with its model, estimate and response ID", req.AttemptID)
		}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, ProviderName: "prov", Tools: reg})
		t.Cleanup(e.StopNow)

		// Two steps: the first is queued with the claim, the second begun
		// after the tool's result; both record what is known.
		b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 2, b.answered(t, "m1"), "the tool step's message and the answer's")
		reqs := p.requests()
		require.Len(t, reqs, 2)
		for _, req := range reqs {
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'succeeded'
				AND provider = 'prov' AND model = 'model-x' AND request_tokens = $2 AND response_id = $3`,
				req.AttemptID, estimate(t, req), "resp/"+req.AttemptID), "attempt %s keeps its first response ID", req.AttemptID)
		}
	})

	t.Run("AFailingResponseIDWriteDoesNotFailTheTurn", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		// The database refuses the in-flight write (and only that one): a
		// data error no retry can fix.
		_, err := b.pool.Exec(ctx, `
			CREATE FUNCTION refuse_in_flight_id() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'refused response id' USING ERRCODE = '22023'; END $$;
			CREATE TRIGGER refuse_in_flight_id BEFORE UPDATE ON attempts FOR EACH ROW
			WHEN (NEW.state = 'started' AND NEW.response_id IS NOT NULL) EXECUTE FUNCTION refuse_in_flight_id();`)
		require.NoError(t, err)
		failures := &testkit.Counts{}
		p := &spendProvider{}
		p.hold = func(provider.Request) {
			assert.Eventually(t, func() bool { return failures.Get("") == 1 },
				10*time.Second, 5*time.Millisecond, "the failed write is counted")
		}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p,
			OnResponseIDWriteFailedFunc: func() { failures.Add("") }})
		t.Cleanup(e.StopNow)

		b.admit(t, "s", "m1", "hello")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		require.Equal(t, 1, b.answered(t, "m1"), "the turn went on")
		req := p.requests()[0]
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'succeeded' AND response_id = $2`,
			req.AttemptID, "resp/"+req.AttemptID), "the outcome's write records the ID instead")
		require.Equal(t, 0, b.count(t, `SELECT count(*) FROM claims`), "released")
		require.Equal(t, 1, failures.Get(""))
	})

	t.Run("AnUnknownOutcomeKeepsTheResponseID", func(t *testing.T) {
		t.Parallel()
		b := setupExec(t)
		unknown := &testkit.Counts{}
		p := &spendProvider{}
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: unknownAfter{p}, ProviderName: "prov",
			OnAttemptUnknownFunc: func(provider, model string) { unknown.Add(provider + "/" + model) }})
		t.Cleanup(e.StopNow)

		b.admit(t, "s", "m1", "hello")
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
		req := p.requests()[0]
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'unknown'
			AND model = 'model-x' AND response_id = $2 AND request_tokens > 0`, req.AttemptID, "resp/"+req.AttemptID))
		require.Equal(t, 1, unknown.Get("prov/model-x"))
		atRisk, err := ledger.AttemptsAtRisk(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, []ledger.AtRisk{{Provider: "prov", Model: "model-x", Attempts: 1, Tokens: estimate(t, req)}}, atRisk)

		// Resolved by an operator (here: found it ran, so the spend is
		// known), it is no longer at risk, though it stays unknown.
		_, err = b.pool.Exec(ctx, `INSERT INTO resolutions (target_id, round, target_kind, session_id, execution_id,
				assistant_message_id, finding, state_before, resolved_by)
			SELECT attempt_id, 1, 'attempt', session_id, execution_id, assistant_message_id, 'ran', state, 'test'
			FROM attempts WHERE attempt_id = $1`, req.AttemptID)
		require.NoError(t, err)
		atRisk, err = ledger.AttemptsAtRisk(ctx, b.pool)
		require.NoError(t, err)
		require.Empty(t, atRisk)
	})
}

// refusedOnce reports a response ID and refuses the first try (429 with a
// Retry-After), then answers the retry without an ID.
type refusedOnce struct {
	mu    sync.Mutex
	tries int
}

func (r *refusedOnce) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	r.mu.Lock()
	r.tries++
	first := r.tries == 1
	r.mu.Unlock()
	if first {
		req.ResponseIDFunc("resp-of-the-refused-try")
		return provider.Response{}, &provider.RetryAfterError{After: 10 * time.Millisecond, Err: errors.New("429")}
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

func TestAttemptSpendOfARetriedAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	p := &refusedOnce{}
	e := b.executor(t, "a", p, 5*time.Second, 0)
	b.admit(t, "s", "m1", "hello")
	done, err := e.Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 1, b.answered(t, "m1"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'succeeded'
		AND tries = 2 AND response_id IS NULL`), "the answered try reported no ID; the refused try's is not its")
}

// unknownAfter answers every step with provider.ErrOutcomeUnknown after the
// wrapped provider saw it (and reported its response ID).
type unknownAfter struct{ p *spendProvider }

func (u unknownAfter) ModelName() string { return u.p.ModelName() }

func (u unknownAfter) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	if _, err := u.p.Complete(ctx, req); err != nil {
		return provider.Response{}, err
	}
	return provider.Response{}, provider.ErrOutcomeUnknown
}
