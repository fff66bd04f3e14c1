package recovery_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

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
	c.hold = nil // one call is held, not the ones after it
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

func (p *holdingProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	p.mu.Lock()
	hold, held := p.hold, p.held
	p.hold = nil // one call is held, not the ones after it
	p.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return provider.Response{}, ctx.Err()
		}
	}
	for _, m := range req.Turn {
		if m.Text == "/loop" {
			// A model that asks for a tool at every step: the turn ends at
			// the step limit, after a tool step.
			return provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "idem", Input: json.RawMessage(`{}`)}}}, nil
		}
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
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
	admitter *admission.Admitter
	provider *holdingProvider
	side     *runCounter
	idem     *runCounter
	ask      *runCounter // side-effecting, under the ask policy
	reg      *tools.Registry
	rec      *recovery.Recoverer
	// victim is a pool of its own (its backends carry victimApp): the
	// executor and recoverer of the Transient action run on it, and only
	// its backends are cancelled or terminated.
	victim    *pgxpool.Pool
	victimRec *recovery.Recoverer
	seq       int
	// terminal is the first terminal state seen of each attempt, tool
	// call and assistant message ("attempt:ID", "call:ID", "message:ID").
	terminal map[string]string
	// lastEvent is the highest outbox ID whose events Check has seen.
	lastEvent int64
	// turnOf is the turn event that ended each input.
	turnOf map[string]string
	// firstOutbox is the highest outbox ID before the machine started:
	// the outbox has no index by key, so its scans start past it.
	firstOutbox int64
}

var machineRuns atomic.Int64

func newRecoveryMachine(t *rapid.T, pool, victim *pgxpool.Pool) *recoveryMachine {
	m := &recoveryMachine{t: t, pool: pool, victim: victim, prefix: fmt.Sprintf("rm%d-", machineRuns.Add(1)),
		admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{}),
		provider: &holdingProvider{},
		side:     &runCounter{name: "side", class: tools.SideEffecting, runs: map[string]int{}},
		idem:     &runCounter{name: "idem", class: tools.Idempotent, runs: map[string]int{}},
		ask:      &runCounter{name: "ask", class: tools.SideEffecting, runs: map[string]int{}},
		reg:      tools.NewRegistry(),
		terminal: map[string]string{},
		turnOf:   map[string]string{},
	}
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&m.firstOutbox); err != nil {
		t.Fatal(err)
	}
	m.lastEvent = m.firstOutbox
	for i := range 2 {
		m.sessions = append(m.sessions, fmt.Sprintf("%ss%d", m.prefix, i))
	}
	for _, tl := range []tools.Tool{m.side, m.idem, m.ask} {
		if err := m.reg.Register(tl); err != nil {
			t.Fatal(err)
		}
	}
	m.rec = recovery.New(pool, &recovery.Config{OwnerID: "machine", RedriveAfter: time.Hour})
	m.victimRec = recovery.New(victim, &recovery.Config{OwnerID: "machine-victim", RedriveAfter: time.Hour})
	return m
}

func (m *recoveryMachine) executor(owner string) *executor.Executor {
	return m.executorOn(m.pool, owner)
}

// executorOn is an executor whose every statement runs on pool. The tool
// "ask" runs only with permission (docs/design.md, invariant 11).
func (m *recoveryMachine) executorOn(pool *pgxpool.Pool, owner string) *executor.Executor {
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: owner})
	e, err := executor.NewExecutor(pool, &executor.ExecutorConfig{Claims: claims, Provider: m.provider, Tools: m.reg,
		PermissionFunc: func(tool string) tools.Permission {
			if tool == "ask" {
				return tools.Ask
			}
			return tools.Allow
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		m.t.Fatalf("building the machine's executor: %v", err)
	}
	if err := e.Start(context.Background()); err != nil {
		m.t.Fatalf("starting the machine's executor: %v", err)
	}
	return e
}

func (m *recoveryMachine) Admit(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	text := rapid.SampledFrom([]string{
		"plain", "/tool side {}", "/tool idem {}", "/tool idem {}\n/tool side {}",
		// Under ask: parked until a reply (Reply).
		"/tool ask {}",
		// Several calls in one step, of both classes, one under ask.
		"/tool side {}\n/tool idem {}\n/tool ask {}\n/tool side {\"n\": 2}",
	}).Draw(t, "text")
	if rapid.IntRange(0, 7).Draw(t, "loop") == 0 {
		// Rarer than the others: a turn to the step limit costs about
		// fifty commits.
		text = "/loop"
	}
	delivery := envelope.DeliveryQueue
	if rapid.IntRange(0, 4).Draw(t, "steer") == 0 {
		delivery = envelope.DeliverySteer
	}
	m.admit(t, s, text, delivery)
}

func (m *recoveryMachine) admit(t *rapid.T, s, text string, delivery envelope.Delivery) {
	m.seq++
	_, err := m.admitter.Admit(context.Background(), []admission.Incoming{{Prompt: envelope.Prompt{
		MessageID: fmt.Sprintf("%sm%d", m.prefix, m.seq), SessionID: s, Text: text, Delivery: delivery}}})
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
	defer e.StopNow()
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
// maybe recovers the session and runs it again meanwhile, and then lets
// the paused run go on: the zombie must write nothing (invariant 5), with
// or without a takeover, whatever ran after it.
func (m *recoveryMachine) Crash(t *rapid.T) {
	s := rapid.SampledFrom(m.sessions).Draw(t, "session")
	where := rapid.SampledFrom([]string{"provider", "side", "idem", "ask"}).Draw(t, "where")
	hold, held := m.holdAt(where)
	defer m.unhold()
	e := m.executor("zombie")
	defer e.StopNow()
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
			if rapid.Bool().Draw(t, "run while paused") {
				// Another executor takes the session on while the
				// zombie sleeps: its claim is live when the zombie
				// resumes.
				m.unhold()
				m.run(t, s)
			}
		}
		before := m.writes(t, s)
		close(hold) // resumes: a zombie
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the zombie did not stop")
		}
		if after := m.writes(t, s); after != before {
			t.Fatalf("the zombie of %s wrote after its lease ran out:\nbefore %s\nafter  %s", s, before, after)
		}
	case <-done:
		return // it never reached the point: nothing to crash
	case <-time.After(20 * time.Second):
		t.Fatal("the run neither reached its crash point nor finished")
	}
}

// holdAt makes the next call of the provider or of a tool signal held and
// wait for hold to be closed.
func (m *recoveryMachine) holdAt(where string) (hold, held chan struct{}) {
	hold, held = make(chan struct{}), make(chan struct{}, 1)
	switch where {
	case "provider":
		m.provider.mu.Lock()
		m.provider.hold, m.provider.held = hold, held
		m.provider.mu.Unlock()
	default:
		c := map[string]*runCounter{"side": m.side, "idem": m.idem, "ask": m.ask}[where]
		c.mu.Lock()
		c.hold, c.held = hold, held
		c.mu.Unlock()
	}
	return hold, held
}

func (m *recoveryMachine) unhold() {
	m.provider.mu.Lock()
	m.provider.hold = nil
	m.provider.mu.Unlock()
	for _, c := range []*runCounter{m.side, m.idem, m.ask} {
		c.mu.Lock()
		c.hold = nil
		c.mu.Unlock()
	}
}

// writes sums up every row of the session that an execution writes: a
// change between two readings is a write.
func (m *recoveryMachine) writes(t *rapid.T, s string) string {
	var out string
	if err := m.pool.QueryRow(context.Background(), `SELECT concat_ws(' | ',
		(SELECT string_agg(message_id || '=' || status, ',' ORDER BY message_id) FROM messages WHERE session_id = $1),
		(SELECT string_agg(attempt_id || '=' || state || '/' || tries, ',' ORDER BY attempt_id) FROM attempts WHERE session_id = $1),
		(SELECT string_agg(call_id || '=' || state, ',' ORDER BY call_id) FROM tool_calls WHERE session_id = $1),
		(SELECT string_agg(message_id || '=' || coalesce(promotion_seq::text, '-'), ',' ORDER BY message_id) FROM inputs WHERE session_id = $1),
		(SELECT count(*)::text FROM outbox WHERE id > $2 AND key = $1),
		(SELECT string_agg(request_id || '=' || status, ',' ORDER BY request_id) FROM permission_requests WHERE session_id = $1),
		(SELECT string_agg(execution_id || '/' || fencing_token || '/' || phase || '/' || coalesce(assistant_message_id, ''), ',') FROM claims WHERE session_id = $1),
		(SELECT fencing_token::text FROM sessions WHERE session_id = $1))`, s, m.firstOutbox).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func (m *recoveryMachine) Recover(t *rapid.T) {
	if _, err := m.rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (m *recoveryMachine) Check(t *rapid.T) {
	var asked []string // idempotency keys of the calls of "ask" that ran
	for _, c := range []*runCounter{m.side, m.ask} {
		c.mu.Lock()
		for key, n := range c.runs {
			if n > 1 {
				c.mu.Unlock()
				t.Fatalf("side-effecting call %s of %s ran %d times", key, c.name, n)
			}
			if c == m.ask {
				asked = append(asked, key)
			}
		}
		c.mu.Unlock()
	}
	ctx := context.Background()
	// Events never change once written and messages are never deleted:
	// each event is checked once, when first seen (the database is shared
	// by every sequence of the run, and grows with it).
	var orphanContinuations int
	var lastEvent int64
	var danglingClaims, danglingEvents, unpermitted, answeredTwice, quarantined, misreconciled []string
	var turnEvents [][]string
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
		(SELECT coalesce(max(id), $2) FROM outbox WHERE id > $2),
		-- A call under ask runs only when its request was approved, or
		-- without a request under an "always" grant of its session.
		(SELECT coalesce(array_agg(c.call_id || ' (' || coalesce(r.status || ' ' || coalesce(r.message, ''), 'no request') || ')'), '{}')
			FROM tool_calls c LEFT JOIN permission_requests r ON r.request_id = c.call_id
			WHERE c.idempotency_key = ANY($3) AND c.session_id = ANY($1)
			AND NOT coalesce(r.status = 'approved', EXISTS (SELECT 1 FROM permission_grants g WHERE g.session_id = c.session_id AND g.pattern = c.tool))),
		-- No input is answered twice: at most one final assistant message
		-- (errored, or completed without tool calls) answers it.
		(SELECT coalesce(array_agg(x.message_id || ' x' || x.n), '{}') FROM (
			SELECT i.message_id, count(*) AS n FROM inputs i JOIN messages a ON a.session_id = i.session_id AND i.message_id = ANY(a.answers)
			WHERE i.session_id = ANY($1) AND a.role = 'assistant' AND (a.status = 'errored' OR (a.status = 'completed'
				AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message_id = a.message_id AND p.kind = 'tool_call')))
			GROUP BY 1 HAVING count(*) > 1) x),
		-- Nothing valid is quarantined: the machine writes no invalid row.
		(SELECT coalesce(array_agg(q), '{}') FROM (
			SELECT 'claim ' || session_id || ': ' || quarantine_reason AS q FROM claims WHERE session_id = ANY($1) AND quarantine_reason IS NOT NULL
			UNION ALL SELECT 'input ' || message_id || ': ' || quarantine_reason FROM inputs WHERE session_id = ANY($1) AND quarantine_reason IS NOT NULL
			UNION ALL SELECT 'recovery ' || execution_id || ': ' || quarantine_reason FROM recoveries WHERE session_id = ANY($1) AND quarantine_reason IS NOT NULL
			UNION ALL SELECT 'outbox ' || id || ': ' || quarantine_reason FROM outbox WHERE id > $4 AND key = ANY($1) AND quarantine_reason IS NOT NULL) q),
		-- A claim whose phase says nothing was in flight is never
		-- reconciled as unknown.
		(SELECT coalesce(array_agg(execution_id || ' (' || phase_found || ')'), '{}') FROM recoveries
			WHERE session_id = ANY($1) AND decision = 'reconciled' AND phase_found <> 'unknown'),
		-- The turn events seen for the first time, as [event ID, message IDs...].
		(SELECT coalesce(jsonb_agg(jsonb_build_array(p ->> 'id') || coalesce(p -> 'message_ids', '[]')), '[]') FROM (
			SELECT convert_from(o.payload, 'UTF8')::jsonb AS p FROM outbox o
			WHERE o.id > $2 AND o.topic = 'session-events' AND o.key = ANY($1)) e
			WHERE p ->> 'type' IN ('turn.completed', 'turn.failed'))`, m.sessions, m.lastEvent, asked, m.firstOutbox).
		Scan(&orphanContinuations, &danglingClaims, &danglingEvents, &lastEvent, &unpermitted, &answeredTwice, &quarantined, &misreconciled, &turnEvents)
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
	if len(unpermitted) > 0 {
		t.Fatalf("calls under ask ran without permission: %v", unpermitted)
	}
	if len(answeredTwice) > 0 {
		t.Fatalf("inputs answered by more than one final assistant message: %v", answeredTwice)
	}
	if len(quarantined) > 0 {
		t.Fatalf("valid rows quarantined: %v", quarantined)
	}
	if len(misreconciled) > 0 {
		t.Fatalf("claims reconciled as unknown whose phase said nothing was in flight: %v", misreconciled)
	}
	// Every input ends in at most one turn (one turn event, by event ID:
	// the relay may publish an event twice, never two events of a turn).
	for _, e := range turnEvents {
		for _, id := range e[1:] {
			if first, ok := m.turnOf[id]; ok && first != e[0] {
				t.Fatalf("input %s ended in two turns: events %s and %s", id, first, e[0])
			}
			m.turnOf[id] = e[0]
		}
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

// finish drains: recovery over every expired claim, a reply to every
// pending ask, then clean runs, until the sessions are quiescent; and
// checks that every admitted prompt was promoted and its turn settled,
// every attempt and tool call ended, and nothing is left waiting.
func (m *recoveryMachine) finish(t *rapid.T) {
	ctx := context.Background()
	for round := 0; ; round++ {
		if _, err := m.pool.Exec(ctx, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = ANY($1)`, m.sessions); err != nil {
			t.Fatal(err)
		}
		if _, err := m.rec.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		rows, err := m.pool.Query(ctx, `SELECT request_id FROM permission_requests WHERE session_id = ANY($1) AND status = 'pending'`, m.sessions)
		if err != nil {
			t.Fatal(err)
		}
		pending, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range pending {
			m.reply(t, id, rapid.SampledFrom([]string{"once", "always", "decline", "feedback"}).Draw(t, "final reply"))
		}
		for _, s := range m.sessions {
			m.run(t, s)
		}
		var busy bool
		if err := m.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM claims WHERE session_id = ANY($1))
			OR EXISTS (SELECT 1 FROM permission_requests WHERE session_id = ANY($1) AND status = 'pending')
			OR EXISTS (SELECT 1 FROM inputs WHERE session_id = ANY($1) AND promotion_seq IS NULL)`, m.sessions).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if !busy {
			break
		}
		if round == 8 {
			t.Fatalf("the sessions are not quiescent after %d rounds of recovery, replies and runs", round+1)
		}
	}
	var lost, unsettled, quarantined, calls, attempts int
	err := m.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inputs WHERE session_id = ANY($1) AND wake_pending AND promotion_seq IS NULL),
		(SELECT count(*) FROM messages WHERE session_id = ANY($1) AND role = 'assistant' AND status = 'pending'),
		(SELECT count(*) FROM claims WHERE session_id = ANY($1) AND quarantine_reason IS NOT NULL),
		(SELECT count(*) FROM tool_calls WHERE session_id = ANY($1) AND state NOT IN ('succeeded', 'failed', 'interrupted', 'unknown')),
		(SELECT count(*) FROM attempts WHERE session_id = ANY($1) AND state NOT IN ('succeeded', 'failed', 'unknown'))`, m.sessions).
		Scan(&lost, &unsettled, &quarantined, &calls, &attempts)
	if err != nil {
		t.Fatal(err)
	}
	if unsettled > 0 {
		rows, _ := m.pool.Query(ctx, `SELECT m.message_id, m.execution_id, m.fencing_token, coalesce(m.turn_id,''),
			coalesce((SELECT string_agg(decision || '/' || phase_found || '/' || coalesce(rule,''), ',') FROM recoveries r WHERE r.execution_id = m.execution_id), 'no recovery'),
			coalesce((SELECT string_agg(a.attempt_id || '=' || a.state, ',') FROM attempts a WHERE a.assistant_message_id = m.message_id), 'no attempt')
			FROM messages m WHERE m.session_id = ANY($1) AND m.role = 'assistant' AND m.status = 'pending'`, m.sessions)
		for rows.Next() {
			var id, ex, turn, rec, att string
			var tok int64
			_ = rows.Scan(&id, &ex, &tok, &turn, &rec, &att)
			t.Logf("pending %s exec %s token %d turn %s recoveries [%s] attempts [%s]", id, ex, tok, turn, rec, att)
		}
		rows.Close()
	}
	if lost > 0 || unsettled > 0 || quarantined > 0 || calls > 0 || attempts > 0 {
		t.Fatalf("after recovery and clean runs: %d inputs never promoted, %d turns never settled, %d claims quarantined, %d tool calls and %d attempts not terminal",
			lost, unsettled, quarantined, calls, attempts)
	}
	m.Check(t)
}

func TestRecoveryStateMachine(t *testing.T) {
	t.Parallel()
	pool, url := testkit.Pool(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = victimApp
	victim, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Close)
	rapid.Check(t, func(rt *rapid.T) {
		m := newRecoveryMachine(rt, pool, victim)
		rt.Repeat(map[string]func(*rapid.T){
			"Admit":     m.Admit,
			"Run":       m.Run,
			"Crash":     m.Crash,
			"Recover":   m.Recover,
			"Reply":     m.Reply,
			"Steer":     m.Steer,
			"Transient": m.Transient,
			"":          m.Check,
		})
		m.finish(rt)
	})
	// Non-vacuity: what recovery found and decided, and the machine
	// reached every kind of transient error.
	var found string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(x, ', '), '') FROM (
		SELECT phase_found || ' -> ' || decision || ': ' || count(*) AS x FROM recoveries GROUP BY phase_found, decision ORDER BY 1) y`).Scan(&found); err != nil {
		t.Fatal(err)
	}
	t.Logf("recoveries, phase found -> decision: %s", found)
	// Every kind must be reached in a hunt; the default run's 25
	// sequences reach most, not always all, so it requires at least one.
	var total int64
	for what, n := range faultsInjected {
		t.Logf("transient errors injected, %s: %d", what, n.Load())
		total += n.Load()
		if n.Load() == 0 && rapidChecks() >= 100 && !t.Failed() {
			t.Errorf("no transient error injected at %s in %d sequences", what, rapidChecks())
		}
	}
	if total == 0 && !t.Failed() {
		t.Error("no transient error injected at all")
	}
}

// rapidChecks is the number of sequences rapid runs: -rapid.checks
// (rapid's default, 100, when the flag is not there), a fifth of it under
// -short.
func rapidChecks() int {
	n := 100
	if f := flag.Lookup("rapid.checks"); f != nil {
		if v, err := strconv.Atoi(f.Value.String()); err == nil {
			n = v
		}
	}
	if testing.Short() {
		n /= 5 // as rapid does
	}
	return n
}
