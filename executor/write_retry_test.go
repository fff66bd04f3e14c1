package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// effectTool is a side-effecting tool that counts its runs: a second run
// would be a repeated side effect.
type effectTool struct{ runs atomic.Int32 }

func (e *effectTool) Spec() tools.Spec {
	return tools.Spec{Name: "effect", Description: "counts its runs", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (e *effectTool) Run(context.Context, tools.Call) (tools.Result, error) {
	e.runs.Add(1)
	return tools.Result{Output: "done"}, nil
}

// gateProvider is the scripted provider, counting its requests; when
// armed, a request signals answered once its answer is ready and waits
// for the gate before returning it, so that the test can break the
// database exactly between the provider's answer and the write that
// records it.
// blockTool is a side-effecting tool that runs until its context ends
// (a shutdown), and says so.
type blockTool struct{ started chan struct{} }

func (b *blockTool) Spec() tools.Spec {
	return tools.Spec{Name: "block", Description: "runs until cancelled", InputSchema: json.RawMessage(`{"type":"object"}`), Class: tools.SideEffecting}
}

func (b *blockTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	b.started <- struct{}{}
	<-ctx.Done()
	return tools.Result{}, ctx.Err()
}

type gateProvider struct {
	calls    atomic.Int32
	armed    atomic.Bool
	notSent  atomic.Bool // the next request fails as certainly not sent
	answered chan struct{}
	gate     chan struct{}
}

func (p *gateProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	p.calls.Add(1)
	if p.notSent.Swap(false) {
		return provider.Response{}, fmt.Errorf("connection refused: %w", provider.ErrNotSent)
	}
	resp, err := scripted.ScriptedProvider{}.Complete(ctx, req)
	if p.armed.Swap(false) {
		p.answered <- struct{}{}
		<-p.gate
	}
	return resp, err
}

// docs/design.md, invariant 13: a transient database error on a write that
// records what a dispatch returned (the provider's answer, a tool's
// result, a failed turn) is retried while the lease lives, and never turns
// a known outcome into outcome_unknown. The executor reaches Postgres
// through the fault proxy; the test reads the database directly.
func TestWriteAfterDispatchRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		*execBundle
		proxy    *pgproxy.Proxy
		ppool    *pgxpool.Pool       // the executor's pool, through the proxy
		dials    atomic.Int64        // connections the executor's pool began to open
		lastDial atomic.Int64        // when the last of them began (Unix ns)
		logs     *testkit.SyncBuffer // the executor's log
		provider *gateProvider
		tool     *effectTool
		block    *blockTool
		exec     *executor.Executor
		fenced   atomic.Int32 // executions that believed their claim lost
	}
	// setupWith is setup with the claims' round-trip timeout (0: the
	// default, or the lease when longer).
	var setupWith func(t *testing.T, lease, roundTrip time.Duration, perm ...tools.Permission) *bundle
	setup := func(t *testing.T, lease time.Duration, perm ...tools.Permission) *bundle {
		t.Helper()
		return setupWith(t, lease, 0, perm...)
	}
	setupWith = func(t *testing.T, lease, roundTrip time.Duration, perm ...tools.Permission) *bundle {
		t.Helper()
		pool, dbURL := testkit.Pool(t)
		proxy, proxied := pgproxy.StartFor(t, dbURL)
		b := &bundle{
			execBundle: &execBundle{pool: pool, admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{})},
			proxy:      proxy, tool: &effectTool{}, block: &blockTool{started: make(chan struct{}, 1)},
			provider: &gateProvider{answered: make(chan struct{}, 1), gate: make(chan struct{})},
		}
		pcfg, err := pgxpool.ParseConfig(proxied)
		require.NoError(t, err)
		// Connections are counted here, where the pool begins them: the
		// proxy counts a refusal when it accepts, which may come after the
		// pool gave up on that connection (it waited in the listen queue),
		// and it also accepts the cancel requests pgx sends, from a
		// goroutine of its own, for a query cut off mid-way (not a retry).
		pcfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			b.dials.Add(1)
			b.lastDial.Store(time.Now().UnixNano())
			return nil
		}
		ppool, err := pgxpool.NewWithConfig(ctx, pcfg)
		require.NoError(t, err)
		t.Cleanup(ppool.Close)
		b.ppool = ppool
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(b.tool))
		require.NoError(t, reg.Register(b.block))
		b.logs = testkit.NewSyncBuffer()
		log := testkit.Logger(t, b.logs)
		claims := ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: lease, RoundTripTimeout: roundTrip, OwnerID: "w", Logger: log,
			OnFencedFunc: func() { b.fenced.Add(1) }})
		cfg := &executor.ExecutorConfig{Claims: claims, Provider: b.provider, Tools: reg, Logger: log}
		if len(perm) > 0 {
			cfg.PermissionFunc = func(string) tools.Permission { return perm[0] }
		}
		b.exec = newExecutor(t, ppool, cfg)
		t.Cleanup(b.exec.StopNow)
		return b
	}
	run := func(t *testing.T, b *bundle, session string) {
		t.Helper()
		done, err := b.exec.Wake(ctx, session, 0)
		require.NoError(t, err)
		wait(t, done)
	}
	// events lists the events of type typ of msg's turns (every test
	// here runs session s).
	events := func(t *testing.T, b *bundle, msg, typ string) []envelope.Event {
		t.Helper()
		var out []envelope.Event
		for _, e := range testkit.SessionEvents(t, b.pool, "s", typ) {
			if slices.Contains(e.MessageIDs, msg) {
				out = append(out, e)
			}
		}
		return out
	}
	// completed checks that msg's turn ended once, normally, with steps
	// provider requests and nothing unknown, and the claim is gone.
	completed := func(t *testing.T, b *bundle, msg string, steps int) {
		t.Helper()
		require.Len(t, events(t, b, msg, envelope.EventTurnCompleted), 1, "one turn.completed")
		require.Empty(t, events(t, b, msg, envelope.EventTurnFailed), "no turn.failed")
		require.Equal(t, int32(steps), b.provider.calls.Load(), "each step dispatched once")
		require.Equal(t, steps, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'succeeded'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE state <> 'succeeded'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE state <> 'succeeded'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status <> 'completed'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
	}
	// The answer's commit: a step's response, on the transactional path or
	// as the common turn's one call.
	isAnswer := func(label string) bool {
		return strings.Contains(label, "UPDATE attempts SET state = $2") || strings.Contains(label, "promptline_turn_answer")
	}

	t.Run("AnswerLostBeforeCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutBeforeCommit(isAnswer)
		b.admit(t, "s", "m1", "/reply hello")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().CutsBefore, "the answer's commit was cut")
		completed(t, b, "m1", 1)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts p JOIN messages m USING (message_id)
			WHERE m.role = 'assistant' AND p.body = 'hello'`))
	})

	t.Run("AnswerCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(isAnswer)
		b.admit(t, "s", "m1", "/reply hello")
		b.admit(t, "s", "m2", "/reply again") // waits: the claim is kept for it
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts, "the answer's commit was committed and its answer cut")
		require.Len(t, events(t, b, "m1", envelope.EventTurnCompleted), 1)
		require.Len(t, events(t, b, "m2", envelope.EventTurnCompleted), 1, "the next turn ran too")
		require.Equal(t, int32(2), b.provider.calls.Load())
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE state <> 'succeeded'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	})

	t.Run("AnswerCommittedButUnheardWithRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(isAnswer)
		b.admit(t, "s", "m1", "/reply hello")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		completed(t, b, "m1", 1)
	})

	t.Run("DatabaseAwayForASecond", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.provider.armed.Store(true)
		b.admit(t, "s", "m1", "/reply hello")
		done, err := b.exec.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-b.provider.answered
		b.proxy.Refuse(true)
		require.Positive(t, b.proxy.CutAll(), "the executor's connections were cut")
		back := time.AfterFunc(time.Second, func() { b.proxy.Refuse(false) })
		defer back.Stop()
		close(b.provider.gate)
		wait(t, done)
		require.Positive(t, b.proxy.Stats().Refused, "the executor met the outage")
		completed(t, b, "m1", 1)
	})

	t.Run("ToolCallsCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_step_calls") }) // the first step's response and its calls
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, int32(1), b.tool.runs.Load(), "the side effect ran once")
		completed(t, b, "m1", 2)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls`))
	})

	t.Run("ToolResultCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_call_settle") })
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, int32(1), b.tool.runs.Load(), "the side effect ran once")
		completed(t, b, "m1", 2)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE role = 'tool'`))
		require.Equal(t, 1, testkit.CountEvents(t, b.pool, "s", envelope.EventToolCompleted), "the result announced once")
	})

	// The call's intent committed unheard: the call is not run until the
	// retry finds it started, then runs once, and is not left unknown.
	t.Run("ToolIntentCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_call_start") })
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, int32(1), b.tool.runs.Load(), "the side effect ran once")
		completed(t, b, "m1", 2)
	})

	// A provider attempt's intent committed unheard: nothing was
	// dispatched, so the retry that finds it landed lets the step run,
	// once, where the turn was left to recovery as outcome unknown. The
	// queued turn's promotion (promptline_turn_next) and a later step's
	// intent (promptline_step_begin).
	// The claim with the first turn (promptline_turn_first): committed
	// unheard, it is found and kept; cut before its commit, it is sent
	// again. Either way the turn runs once.
	isFirst := func(label string) bool { return strings.Contains(label, "promptline_turn_first") }
	t.Run("FirstTurnCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(isFirst)
		b.admit(t, "s", "m1", "/reply hello")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts, "the claim's commit was committed and its answer cut")
		require.Len(t, events(t, b, "m1", envelope.EventTurnStarted), 1, "started once")
		completed(t, b, "m1", 1)
		require.Zero(t, b.fenced.Load(), "the claim found is the execution's own")
	})

	t.Run("FirstTurnLostBeforeCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutBeforeCommit(isFirst)
		b.admit(t, "s", "m1", "/reply hello")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().CutsBefore, "the claim's commit was cut before the server had it")
		require.Len(t, events(t, b, "m1", envelope.EventTurnStarted), 1, "started once")
		completed(t, b, "m1", 1)
	})

	t.Run("QueuedTurnIntentCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_turn_next") })
		b.admit(t, "s", "m1", "/reply one")
		b.admit(t, "s", "m2", "/reply two") // queued behind m1: promoted by the same claim
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts, "the second turn's promotion was committed and its answer cut")
		require.Len(t, events(t, b, "m1", envelope.EventTurnCompleted), 1)
		require.Len(t, events(t, b, "m2", envelope.EventTurnCompleted), 1, "the promoted turn ran")
		require.Len(t, events(t, b, "m2", envelope.EventTurnStarted), 1, "and was started once")
		require.Equal(t, int32(2), b.provider.calls.Load(), "each turn dispatched once")
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE state <> 'succeeded'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	})

	t.Run("StepIntentCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_step_begin") })
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts, "the second step's intent was committed and its answer cut")
		require.Equal(t, int32(1), b.tool.runs.Load(), "the side effect ran once")
		completed(t, b, "m1", 2)
	})

	// The deferral of an attempt that certainly was not sent committed
	// unheard: the retry finds it deferred, and the step is sent again
	// once.
	t.Run("DeferralCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.provider.notSent.Store(true)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "SET state = 'retry_wait'") })
		b.admit(t, "s", "m1", "/reply hello")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Len(t, events(t, b, "m1", envelope.EventTurnCompleted), 1)
		require.Empty(t, events(t, b, "m1", envelope.EventTurnFailed))
		require.Equal(t, int32(2), b.provider.calls.Load(), "not sent, then sent once")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'succeeded' AND tries = 2`), "one attempt, begun twice")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	})

	// The ask committed unheard: the session parks once, with one
	// request and one permission.asked.
	t.Run("PermissionAskCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second, tools.Ask)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "UPDATE claims SET phase") })
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests WHERE status = 'pending'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE convert_from(payload, 'UTF8') LIKE '%permission.asked%'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "parked: the claim is released")
		require.Zero(t, b.tool.runs.Load(), "not run before the reply")
		require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE state <> 'requested'`))
	})

	// A promotion that is not the common turn's one call (promoteTx: a
	// continuation, a permission reply) commits its turn's first intent,
	// or the calls it resumes, in one transaction. Committed unheard, the
	// retry's fence finds its position applied, and the turn it built
	// runs, once: the approved call runs once, and the turn completes. It
	// was left to recovery as outcome unknown before.
	t.Run("PermissionResumeCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second, tools.Ask)
		b.admit(t, "s", "m1", "/tool effect {}")
		run(t, b, "s")
		approvePending(t, b.execBundle)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "SET resumed_at") })
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts, "the resume was committed and its answer cut")
		require.Equal(t, int32(1), b.tool.runs.Load(), "the approved side effect ran once")
		completed(t, b, "m1", 2)
	})

	// readsTranscript says whether a unit's statements read the
	// transcript (the history's join).
	readsTranscript := func(stmts []string) bool {
		for _, s := range stmts {
			if strings.Contains(s, "FROM messages m LEFT JOIN LATERAL") {
				return true
			}
		}
		return false
	}

	// silenceNextRead admits prompts (session s) and runs them; once the
	// first step has its answer, the next unit that reads the transcript
	// goes silent (the session's read before the claim reads it too),
	// and the run is waited for. The round trip is bounded by the lease
	// (2 s): the default's 30 s and more would outlast the test's wait.
	silenceNextRead := func(t *testing.T, prompts ...string) *bundle {
		t.Helper()
		b := setupWith(t, 2*time.Second, time.Millisecond)
		// Before the pool's Close, which waits for the given-up
		// connection's cancel request through the proxy (15 s).
		t.Cleanup(b.proxy.Close)
		b.provider.armed.Store(true)
		for i, text := range prompts {
			b.admit(t, "s", fmt.Sprintf("m%d", i+1), text)
		}
		done, err := b.exec.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-b.provider.answered
		b.proxy.SilenceAt(readsTranscript)
		close(b.provider.gate)
		wait(t, done)
		require.Equal(t, 1, b.proxy.Stats().Silenced, "a read went silent")
		return b
	}

	// The transcript's read before a later step's intent holds no
	// position: on a connection gone silent (given up after the
	// round-trip timeout) it is read again, and the turn completes in the
	// same run. It ended the execution before, the claim left to expire
	// and the turn to recovery, for a read.
	t.Run("HistoryReadGivenUpIsReadAgain", func(t *testing.T) {
		t.Parallel()
		b := silenceNextRead(t, "/tool effect {}")
		require.Contains(t, b.logs.String(), "reading the transcript failed transiently", "the read silenced was the step's")
		require.Equal(t, int32(1), b.tool.runs.Load(), "the tool ran once")
		completed(t, b, "m1", 2)
	})

	// The same for the session's read before a later turn's promotion
	// (its queue and transcript, read once the turn before it ended).
	t.Run("ViewReadGivenUpIsReadAgain", func(t *testing.T) {
		t.Parallel()
		b := silenceNextRead(t, "/reply one", "/reply two")
		require.Contains(t, b.logs.String(), "reading the session failed transiently", "the read silenced was the promotion's")
		require.Len(t, events(t, b, "m1", envelope.EventTurnCompleted), 1)
		require.Len(t, events(t, b, "m2", envelope.EventTurnCompleted), 1, "the next turn ran in the same run")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "released")
	})

	// A read that never heals is given up within a lease of its first
	// retry (readRetried), and the claim left to recovery: retried for as
	// long as the keep-alive renews the claim, it would hold the session
	// out of recovery's reach. Every read of the transcript goes silent
	// here.
	t.Run("ReadThatNeverHealsIsGivenUpWithinALease", func(t *testing.T) {
		t.Parallel()
		const lease = 2 * time.Second
		b := setupWith(t, lease, time.Millisecond)
		t.Cleanup(b.proxy.Close)
		b.provider.armed.Store(true)
		b.admit(t, "s", "m1", "/tool effect {}")
		done, err := b.exec.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-b.provider.answered
		b.proxy.SilenceEvery(readsTranscript)
		began := time.Now()
		close(b.provider.gate)
		select {
		case <-done:
		case <-time.After(10 * lease):
			t.Fatalf("the execution still reads after %s (lease %s)", 10*lease, lease)
		}
		took := time.Since(began)
		t.Logf("given up after %s and %d silent reads (lease %s)", took, b.proxy.Stats().Silenced, lease)
		require.GreaterOrEqual(t, b.proxy.Stats().Silenced, 2, "the read was retried")
		// The first try's round trip (the lease here), then a lease of
		// retries, and some slack for the tool and the backoff.
		require.Less(t, took, 3*lease, "the read was retried past a lease")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims`), "the claim is left to expire, for recovery")
		require.Empty(t, events(t, b, "m1", envelope.EventTurnCompleted), "the turn did not complete")
	})

	t.Run("FailedTurnCommittedButUnheard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "UPDATE tool_calls SET state = 'interrupted'") })
		b.admit(t, "s", "m1", "/fail boom")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		failed := events(t, b, "m1", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, envelope.FailProviderError, failed[0].Reason, "the provider's failure, not an unknown outcome")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'failed'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Zero(t, b.fenced.Load(), "the release that committed with the failure is told from a lost claim")
	})

	// The same with a prompt waiting: the claim stays, the retry finds the
	// failure written and commits only its renewal, and the next turn runs.
	t.Run("FailedTurnCommittedButUnheardWithAPromptWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 5*time.Second)
		b.proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "UPDATE tool_calls SET state = 'interrupted'") })
		b.admit(t, "s", "m1", "/fail boom")
		b.admit(t, "s", "m2", "/reply next")
		run(t, b, "s")
		require.Equal(t, 1, b.proxy.Stats().AmbiguousCuts)
		require.Len(t, events(t, b, "m1", envelope.EventTurnFailed), 1)
		require.Len(t, events(t, b, "m2", envelope.EventTurnCompleted), 1, "the next turn ran")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'errored'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'failed'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Zero(t, b.fenced.Load())
	})

	// A shutdown past its grace cuts a tool off while the database is
	// away: the executor writes the call's result once, on a context that
	// outlives the cancellation, and stops at once; it does not retry for
	// the rest of its lease. The claim is left to expire (phase unknown,
	// the call started), for recovery, as after a crash.
	t.Run("ShutdownDoesNotWaitForTheLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 20*time.Second)
		b.admit(t, "s", "m1", "/tool block {}")
		done, err := b.exec.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-b.block.started
		b.proxy.Refuse(true)
		b.proxy.CutAll()
		stopped := make(chan struct{})
		go func() { b.exec.StopNow(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("Stop still waits 5 s after the shutdown: the executor retries a write past the grace")
		}
		wait(t, done)
		b.proxy.Refuse(false)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'unknown'`), "the claim is left for recovery")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'started'`))
	})

	// The lease ends before the database is back: the executor stops
	// retrying and leaves the claim to expire, as a crash would, for
	// recovery to decide; it writes nothing after its lease.
	t.Run("LeaseEndsFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1500*time.Millisecond)
		b.provider.armed.Store(true)
		b.admit(t, "s", "m1", "/reply hello")
		done, err := b.exec.Wake(ctx, "s", 0)
		require.NoError(t, err)
		<-b.provider.answered
		b.proxy.Refuse(true)
		b.proxy.CutAll()
		close(b.provider.gate)
		wait(t, done) // it gave up: it does not retry past its lease
		// A connection the pool was opening for an acquire given up on
		// (the lease's renewal, cancelled as the run ended) is still
		// opened in the background and refused: not a retry. Counted once
		// none is under way.
		require.Eventually(t, func() bool { return b.ppool.Stat().ConstructingConns() == 0 },
			10*time.Second, 5*time.Millisecond, "the pool's connects end")
		dials := b.dials.Load()
		require.GreaterOrEqual(t, b.proxy.Stats().Refused, 2, "it retried while the lease lived")
		b.proxy.Refuse(false)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'unknown'`), "the claim is left for recovery")
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM claims WHERE expires_at <= now()`) == 1
		}, 10*time.Second, 10*time.Millisecond, "the claim expires")
		// Every retry began while the lease lived: the claim's expiry is
		// the last renewal's, as nothing reached the database since (the
		// slack is for a timer's goroutine run late on a loaded machine).
		var expires time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT expires_at FROM claims`).Scan(&expires))
		last := time.Unix(0, b.lastDial.Load())
		require.False(t, last.After(expires.Add(250*time.Millisecond)),
			"a connection began %s after the lease ended", last.Sub(expires))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE state = 'started'`), "nothing written after the lease")
		require.Empty(t, events(t, b, "m1", envelope.EventTurnCompleted))
		require.Equal(t, dials, b.dials.Load(), "no retry after giving up")
	})
}
