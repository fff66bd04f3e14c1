package recovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/pipeline"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// runCounter is a tool that counts how often each call ran, and can hold a
// run until released (the point where a process is paused or killed).
type runCounter struct {
	name  string
	class tools.Class
	mu    sync.Mutex
	runs  map[string]int // by call ID
	hold  chan struct{}  // when set, Run signals held and waits
	held  chan struct{}
}

func (c *runCounter) Spec() tools.Spec {
	return tools.Spec{Name: c.name, Class: c.class, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (c *runCounter) Run(ctx context.Context, call tools.Call) (tools.Result, error) {
	c.mu.Lock()
	c.runs[call.IdempotencyKey]++
	hold, held := c.hold, c.held
	c.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return tools.Result{}, ctx.Err()
		}
	}
	return tools.Result{Output: "ran"}, nil
}

// holdingProvider is the scripted provider, able to hold a call.
type holdingProvider struct {
	mu   sync.Mutex
	hold chan struct{}
	held chan struct{}
}

func (p *holdingProvider) Complete(ctx context.Context, req pipeline.ProviderRequest) (pipeline.ProviderResponse, error) {
	p.mu.Lock()
	hold, held := p.hold, p.held
	p.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return pipeline.ProviderResponse{}, ctx.Err()
		}
	}
	for _, m := range req.Turn {
		if m.Text == "/loop" {
			// A model that asks for a tool at every step: the turn ends at
			// the step limit, after a tool step.
			return pipeline.ProviderResponse{ToolCalls: []pipeline.ToolCall{{ID: "c", Name: "idem", Input: json.RawMessage(`{}`)}}}, nil
		}
	}
	return pipeline.ScriptedProvider{}.Complete(ctx, req)
}

// recoveryMachine interleaves admissions, clean runs, crashes at random
// points (a process that stops mid-call and whose lease lapses; when it
// resumes it is a zombie), and recovery passes, against the real schema
// and code, and checks after every step that no side-effecting call ran
// twice; that a claim and an event only name messages that exist; that
// every provider attempt, tool call and assistant message, once in a
// terminal state, stays in it (one intent, one outcome); and that every
// continuation input has its recovery; at the end, after recovery and
// clean runs, that no admitted input was lost and nothing was quarantined.
type recoveryMachine struct {
	t        *rapid.T
	pool     *pgxpool.Pool
	prefix   string
	sessions []string
	admitter *pipeline.Admitter
	provider *holdingProvider
	side     *runCounter
	idem     *runCounter
	reg      *tools.Registry
	rec      *recovery.Recoverer
	seq      int
	// terminal is the first terminal state seen of each attempt, tool
	// call and assistant message ("attempt:ID", "call:ID", "message:ID").
	terminal map[string]string
	// lastEvent is the highest outbox ID whose events Check has seen.
	lastEvent int64
}

var machineRuns atomic.Int64

func newRecoveryMachine(t *rapid.T, pool *pgxpool.Pool) *recoveryMachine {
	m := &recoveryMachine{t: t, pool: pool, prefix: fmt.Sprintf("rm%d-", machineRuns.Add(1)),
		admitter: pipeline.NewAdmitter(pool, &pipeline.AdmitterConfig{}),
		provider: &holdingProvider{},
		side:     &runCounter{name: "side", class: tools.SideEffecting, runs: map[string]int{}},
		idem:     &runCounter{name: "idem", class: tools.Idempotent, runs: map[string]int{}},
		reg:      tools.NewRegistry(),
		terminal: map[string]string{},
	}
	for i := range 2 {
		m.sessions = append(m.sessions, fmt.Sprintf("%ss%d", m.prefix, i))
	}
	for _, tl := range []tools.Tool{m.side, m.idem} {
		if err := m.reg.Register(tl); err != nil {
			t.Fatal(err)
		}
	}
	m.rec = recovery.New(pool, &recovery.Config{OwnerID: "machine", RedriveAfter: time.Hour})
	return m
}

func (m *recoveryMachine) executor(owner string) *pipeline.Executor {
	claims := ledger.NewClaims(m.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: owner})
	return pipeline.NewExecutor(m.pool, &pipeline.ExecutorConfig{Claims: claims, Provider: m.provider, Tools: m.reg,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
}

func (m *recoveryMachine) Admit(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	text := rapid.SampledFrom([]string{
		"plain", "/tool side {}", "/tool idem {}", "/tool idem {}\n/tool side {}",
	}).Draw(t, "text")
	if rapid.IntRange(0, 7).Draw(t, "loop") == 0 {
		// Rarer than the others: a turn to the step limit costs about
		// fifty commits.
		text = "/loop"
	}
	m.seq++
	_, err := m.admitter.Admit(context.Background(), []pipeline.Incoming{{Prompt: envelope.Prompt{
		MessageID: fmt.Sprintf("%sm%d", m.prefix, m.seq), SessionID: s, Text: text, Delivery: envelope.DeliveryQueue}}})
	if err != nil {
		t.Fatal(err)
	}
}

// Run runs the session cleanly until it is idle.
func (m *recoveryMachine) Run(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	m.run(t, s)
}

func (m *recoveryMachine) run(t *rapid.T, s string) {
	e := m.executor("clean")
	defer e.Stop()
	done, err := e.Wake(context.Background(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a clean run did not finish")
	}
}

// Crash starts a run that stops at a random point (at the provider, or in
// a tool), lets its lease lapse as if the process were paused or killed,
// and then lets it go on: the zombie must write nothing.
func (m *recoveryMachine) Crash(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	where := rapid.SampledFrom([]string{"provider", "side", "idem"}).Draw(t, "where")
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	switch where {
	case "provider":
		m.provider.mu.Lock()
		m.provider.hold, m.provider.held = hold, held
		m.provider.mu.Unlock()
	case "side":
		m.side.mu.Lock()
		m.side.hold, m.side.held = hold, held
		m.side.mu.Unlock()
	case "idem":
		m.idem.mu.Lock()
		m.idem.hold, m.idem.held = hold, held
		m.idem.mu.Unlock()
	}
	defer func() {
		m.provider.mu.Lock()
		m.provider.hold = nil
		m.provider.mu.Unlock()
		for _, c := range []*runCounter{m.side, m.idem} {
			c.mu.Lock()
			c.hold = nil
			c.mu.Unlock()
		}
	}()
	e := m.executor("zombie")
	defer e.Stop()
	done, err := e.Wake(context.Background(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
		// Paused mid-call; its lease lapses.
		if _, err := m.pool.Exec(context.Background(), `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = $1`, s); err != nil {
			t.Fatal(err)
		}
		if rapid.Bool().Draw(t, "recover while paused") {
			if _, err := m.rec.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		close(hold) // resumes: a zombie
	case <-done:
		return // it never reached the point: nothing to crash
	case <-time.After(20 * time.Second):
		t.Fatal("the run neither reached its crash point nor finished")
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the zombie did not stop")
	}
}

func (m *recoveryMachine) Recover(t *rapid.T) {
	if _, err := m.rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (m *recoveryMachine) Check(t *rapid.T) {
	m.side.mu.Lock()
	for key, n := range m.side.runs {
		if n > 1 {
			m.side.mu.Unlock()
			t.Fatalf("side-effecting call %s ran %d times", key, n)
		}
	}
	m.side.mu.Unlock()
	ctx := context.Background()
	// Events never change once written and messages are never deleted:
	// each event is checked once, when first seen (the database is shared
	// by every sequence of the run, and grows with it).
	var orphanContinuations int
	var lastEvent int64
	var danglingClaims, danglingEvents []string
	err := m.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inputs i WHERE i.session_id = ANY($1) AND i.message_id LIKE 'recovery-continue-%'
			AND NOT EXISTS (SELECT 1 FROM recoveries r WHERE r.continuation_message_id = i.message_id)),
		(SELECT coalesce(array_agg(c.session_id || ' -> ' || c.assistant_message_id), '{}') FROM claims c
			WHERE c.session_id = ANY($1) AND coalesce(c.assistant_message_id, '') <> ''
			AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.message_id = c.assistant_message_id AND m.role = 'assistant')),
		(SELECT coalesce(array_agg(e.id || ' -> ' || e.named), '{}') FROM (
			SELECT convert_from(o.payload, 'UTF8')::jsonb ->> 'id' AS id, n.named
			FROM outbox o, LATERAL (
				SELECT convert_from(o.payload, 'UTF8')::jsonb ->> 'assistant_message_id' AS named
				UNION ALL SELECT jsonb_array_elements_text(coalesce(convert_from(o.payload, 'UTF8')::jsonb -> 'message_ids', '[]'))
			) n
			WHERE o.id > $2 AND o.topic = 'session-events' AND o.key = ANY($1) AND coalesce(n.named, '') <> ''
			AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.message_id = n.named)) e),
		(SELECT coalesce(max(id), $2) FROM outbox WHERE id > $2)`, m.sessions, m.lastEvent).
		Scan(&orphanContinuations, &danglingClaims, &danglingEvents, &lastEvent)
	if err != nil {
		t.Fatal(err)
	}
	m.lastEvent = lastEvent
	if orphanContinuations > 0 {
		t.Fatalf("%d continuation inputs without their recovery", orphanContinuations)
	}
	if len(danglingClaims) > 0 {
		t.Fatalf("claims name assistant messages that do not exist: %v", danglingClaims)
	}
	if len(danglingEvents) > 0 {
		t.Fatalf("events name messages that do not exist: %v", danglingEvents)
	}
	rows, err := m.pool.Query(ctx, `
		SELECT 'attempt:' || attempt_id, state FROM attempts WHERE session_id = ANY($1) AND state IN ('succeeded', 'failed', 'unknown')
		UNION ALL
		SELECT 'call:' || call_id, state FROM tool_calls
		WHERE attempt_id IN (SELECT attempt_id FROM attempts WHERE session_id = ANY($1)) AND state IN ('succeeded', 'failed', 'interrupted', 'unknown')
		UNION ALL
		SELECT 'message:' || message_id, status FROM messages WHERE session_id = ANY($1) AND role = 'assistant' AND status <> 'pending'`, m.sessions)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var id, state string
	if _, err := pgx.ForEachRow(rows, []any{&id, &state}, func() error {
		seen[id] = true
		if first, ok := m.terminal[id]; ok && first != state {
			return fmt.Errorf("%s ended %s, and later became %s", id, first, state)
		}
		m.terminal[id] = state
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for id, first := range m.terminal {
		if !seen[id] {
			t.Fatalf("%s ended %s, and later left its terminal state", id, first)
		}
	}
}

// finish drains: recovery over every expired claim, then clean runs, and
// checks that every admitted prompt was promoted and its turn settled.
func (m *recoveryMachine) finish(t *rapid.T) {
	ctx := context.Background()
	for range 3 {
		if _, err := m.pool.Exec(ctx, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id LIKE $1 || '%'`, m.prefix); err != nil {
			t.Fatal(err)
		}
		if _, err := m.rec.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range m.sessions {
			m.run(t, s)
		}
	}
	var lost, unsettled, quarantined int
	err := m.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inputs WHERE session_id LIKE $1 || '%' AND wake_pending AND promotion_seq IS NULL),
		(SELECT count(*) FROM messages WHERE session_id LIKE $1 || '%' AND role = 'assistant' AND status = 'pending'),
		(SELECT count(*) FROM claims WHERE session_id LIKE $1 || '%' AND quarantine_reason IS NOT NULL)`, m.prefix).
		Scan(&lost, &unsettled, &quarantined)
	if err != nil {
		t.Fatal(err)
	}
	if unsettled > 0 {
		rows, _ := m.pool.Query(ctx, `SELECT m.message_id, m.execution_id, m.fencing_token, coalesce(m.turn_id,''),
			coalesce((SELECT string_agg(decision || '/' || phase_found || '/' || coalesce(rule,''), ',') FROM recoveries r WHERE r.execution_id = m.execution_id), 'no recovery'),
			coalesce((SELECT string_agg(a.attempt_id || '=' || a.state, ',') FROM attempts a WHERE a.assistant_message_id = m.message_id), 'no attempt')
			FROM messages m WHERE m.session_id LIKE $1 || '%' AND m.role = 'assistant' AND m.status = 'pending'`, m.prefix)
		for rows.Next() {
			var id, ex, turn, rec, att string
			var tok int64
			_ = rows.Scan(&id, &ex, &tok, &turn, &rec, &att)
			t.Logf("pending %s exec %s token %d turn %s recoveries [%s] attempts [%s]", id, ex, tok, turn, rec, att)
		}
		rows.Close()
	}
	if lost > 0 || unsettled > 0 || quarantined > 0 {
		t.Fatalf("after recovery and clean runs: %d inputs never promoted, %d turns never settled, %d claims quarantined", lost, unsettled, quarantined)
	}
	m.Check(t)
}

func TestRecoveryStateMachine(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	rapid.Check(t, func(rt *rapid.T) {
		m := newRecoveryMachine(rt, pool)
		rt.Repeat(map[string]func(*rapid.T){
			"Admit":   m.Admit,
			"Run":     m.Run,
			"Crash":   m.Crash,
			"Recover": m.Recover,
			"":        m.Check,
		})
		m.finish(rt)
	})
}
