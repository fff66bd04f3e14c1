package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// The crash sweep (docs/testing.md): instead of crash points someone chose,
// a consumer process is killed with SIGKILL right before, or right after,
// its Nth commit of a write (internal/pgdb's commit tracer, faults build
// tag), for N over the commits of a fixed, rich workload; a second process
// then finishes the work with recovery, and the invariants of the design
// are checked on Postgres, the sandbox, a tool server and the events topic.
//
// CRASH_SWEEP chooses the runs: "sample" (the default, make test: a
// seeded random subset of CRASH_SWEEP_RUNS runs, default 6), "full"
// (make test/crash-sweep: every N, before and after), or "every:K" (every
// Kth N, both sides). CRASH_SWEEP_SEED fixes the sample's seed (else
// the time); the seed is printed, so that a failing sample can be run
// again.

// sweepFlags are the consumer flags of every run: a short lease and quick
// recovery passes, so that a run settles in seconds.
func sweepFlags(sandbox, toolURL string) []string {
	return []string{
		"--lease", "2s", "--recovery-interval", "300ms", "--redrive-after", "2s",
		"--sandbox-dir", sandbox, "--tool-permission", "append_line=ask",
		"--http-tool-endpoint", "name=side,url=" + toolURL + "/side,class=side_effecting",
		"--http-tool-endpoint", "name=idem,url=" + toolURL + "/idem,class=idempotent",
	}
}

// toolServer records the requests of the http_request tool's endpoints.
type toolServer struct {
	mu   sync.Mutex
	reqs []toolRequest
}

type toolRequest struct {
	Path, Key, Body string
}

func newToolServer(t *testing.T) (*toolServer, string) {
	s := &toolServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, toolRequest{Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"), Body: string(body)})
		s.mu.Unlock()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func (s *toolServer) requests() []toolRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// finalAnswers counts the assistant messages that end a turn answering $1:
// errored, or completed without asking for tools (a turn with tool steps
// has one assistant message per step, all answering its inputs).
const finalAnswers = `SELECT count(*) FROM messages m WHERE m.role = 'assistant' AND $1 = ANY(m.answers)
	AND (m.status = 'errored' OR (m.status = 'completed'
		AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message_id = m.message_id AND p.kind = 'tool_call')))`

// sweepRun is one run of the workload against one database and broker.
type sweepRun struct {
	b       *testBundle
	rejects *topicReader
	sandbox string
	tools   *toolServer
	toolURL string
	tag     string // unique per run: prompt IDs and side-effect lines

	// The leg (legScripted unless newHTTPSweepRun made it): its provider
	// server and that server's URL (HTTP leg only).
	leg         string
	provider    *providerServer
	providerURL string

	mu      sync.Mutex
	replied map[string]bool // permission request IDs answered
	prompts []envelope.Prompt

	// calm, when set, ends the faults a test injects while it drives the
	// workload: drive calls it once when a step is not done in time, and
	// gives the step as long again without faults. Under faults that
	// never cease, progress is only likely, and on a loaded machine a turn
	// of sixteen steps can lose its lease to a fault at nearly every step;
	// what the promises forbid is a session that stays stuck once the
	// faults are over (P6), and that still fails the test.
	calm func()
}

func newSweepRun(t *testing.T) *sweepRun {
	b := setup(t)
	tools, url := newToolServer(t)
	r := &sweepRun{
		b: b, rejects: readTopic(t, b.addr, "prompts.rejects"), sandbox: t.TempDir(),
		tools: tools, toolURL: url, tag: uuid.NewString()[:8], replied: map[string]bool{}, leg: legScripted,
	}
	return r
}

// legFlags and legSteps are the consumer flags and the workload of the
// run's leg.
func (r *sweepRun) legFlags() []string {
	if r.provider != nil {
		return httpSweepFlags(r.providerURL, r.toolURL)
	}
	return sweepFlags(r.sandbox, r.toolURL)
}

func (r *sweepRun) legSteps() []sweepStep {
	if r.provider != nil {
		return r.httpSteps()
	}
	return r.steps()
}

func (r *sweepRun) session(name string) string { return "sw-" + name + "-" + r.tag }

// sweepStep is one step of the workload: send, then done reports when its
// effect is visible (so that the next step starts on a settled system and
// the commit numbers of two runs mostly line up).
type sweepStep struct {
	name string
	send func(t *testing.T)
	done func(t *testing.T) bool
}

// steps is the workload. Every prompt that should end in a turn is
// recorded in r.prompts; the invariants are checked against that list.
func (r *sweepRun) steps() []sweepStep {
	var steps []sweepStep
	add := func(name string, send func(t *testing.T), done func(t *testing.T) bool) {
		steps = append(steps, sweepStep{name: name, send: send, done: done})
	}
	turn := func(p envelope.Prompt) func(t *testing.T) bool {
		return func(t *testing.T) bool { return len(r.b.events.turnEvents(t, p.MessageID)) > 0 }
	}
	queue := func(session, text string) envelope.Prompt {
		p := envelope.Prompt{MessageID: "m-" + uuid.NewString(), SessionID: session, Text: text}
		r.mu.Lock()
		r.prompts = append(r.prompts, p)
		r.mu.Unlock()
		return p
	}

	plain := queue(r.session("plain"), "hello")
	add("plain prompt", func(t *testing.T) { r.b.send(t, plain) }, turn(plain))
	add("exact duplicate", func(t *testing.T) { r.b.send(t, plain) }, func(*testing.T) bool { return true })
	conflict := plain
	conflict.Text = "a conflicting reuse"
	add("conflicting reuse", func(t *testing.T) { r.b.send(t, conflict) }, func(t *testing.T) bool {
		return r.rejects.count(t, func(e map[string]string) bool { return e["reason"] == envelope.ReasonConflict }) > 0
	})

	held := queue(r.session("resume"), "held back")
	noResume := held
	noResume.Resume = new(bool)
	add("resume:false", func(t *testing.T) { r.b.send(t, noResume) }, func(t *testing.T) bool {
		return len(r.b.events.admittedEvents(t, held.MessageID)) > 0
	})
	add("its retry with resume:true", func(t *testing.T) { r.b.send(t, held) }, turn(held))

	tools := queue(r.session("tools"), fmt.Sprintf(`/tool append_line {"file":"sweep.txt","line":"tools-%[1]s"}
/tool echo {"text":"idempotent"}
/tool http_request {"endpoint":"side","body":{"call":"side-%[1]s"}}
/tool http_request {"endpoint":"idem","body":{"call":"idem-%[1]s"}}`, r.tag))
	add("a step of four tool calls, both classes", func(t *testing.T) { r.b.send(t, tools) }, turn(tools))

	long := queue(r.session("steer"), "/sleep 700ms\nlong")
	steer := queue(long.SessionID, "steered")
	steer.Delivery = envelope.DeliverySteer
	r.prompts[len(r.prompts)-1] = steer
	add("a long turn", func(t *testing.T) { r.b.send(t, long) }, func(t *testing.T) bool {
		return r.b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, long.SessionID) > 0 || turn(long)(t)
	})
	add("a steer while it runs", func(t *testing.T) { r.b.send(t, steer) }, func(t *testing.T) bool {
		return turn(long)(t) && turn(steer)(t)
	})

	for _, s := range []struct{ name, session string }{
		{"a tool under ask, approved", "approve"},
		{"declined without a message", "decline"},
		{"declined with feedback", "feedback"},
	} {
		p := queue(r.session(s.session), fmt.Sprintf(`/tool append_line {"file":"sweep.txt","line":"%s-%s"}`, s.session, r.tag))
		add(s.name, func(t *testing.T) { r.b.send(t, p) }, turn(p))
	}

	limit := queue(r.session("limit"), `/loop echo {"text":"once more"}`)
	add("a turn that reaches the step limit", func(t *testing.T) { r.b.send(t, limit) }, turn(limit))

	fail := queue(r.session("fail"), "/fail the provider is down")
	add("a provider failure", func(t *testing.T) { r.b.send(t, fail) }, turn(fail))

	after := queue(r.session("plain"), "after all that")
	add("a later prompt of the first session", func(t *testing.T) { r.b.send(t, after) }, turn(after))
	return steps
}

// respond answers permission requests as the workload wants: a session
// named "decline" is declined, "feedback" declined with a message, any
// other approved once. Each request is answered once, whatever crashes.
func (r *sweepRun) respond(t *testing.T) {
	for _, e := range r.b.events.events(t) {
		if reply, ok := r.reply(e); ok {
			sendReply(t, r.b, e.SessionID, replyJSON(t, reply))
		}
	}
}

// reply returns the answer to e when e is a permission.asked event not
// answered yet, and marks it answered.
func (r *sweepRun) reply(e envelope.Event) (envelope.PermissionReply, bool) {
	if e.Type != envelope.EventPermissionAsked {
		return envelope.PermissionReply{}, false
	}
	r.mu.Lock()
	seen := r.replied[e.RequestID]
	r.replied[e.RequestID] = true
	r.mu.Unlock()
	if seen {
		return envelope.PermissionReply{}, false
	}
	reply := envelope.PermissionReply{RequestID: e.RequestID, Reply: envelope.ReplyOnce}
	// r.session(name) and the chaos soak's sessions (r.session(name+"-"+i))
	// begin with "sw-"+name+"-".
	switch {
	case strings.HasPrefix(e.SessionID, "sw-decline-"):
		reply.Reply = envelope.ReplyReject
	case strings.HasPrefix(e.SessionID, "sw-feedback-"):
		reply.Reply, reply.Message = envelope.ReplyReject, "answer without the tool"
	}
	return reply, true
}

// drive runs the steps from index from (whose message was sent already
// when sent); it returns the index of the first step not done when alive()
// turned false (len(steps) when all are done). It polls with a deadline:
// the effects it waits for are rows and events of another process.
func (r *sweepRun) drive(t *testing.T, steps []sweepStep, from int, sent bool, alive func() bool) int {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := from; i < len(steps); i++ {
		if i > from || !sent {
			steps[i].send(t)
		}
		deadline := time.Now().Add(40 * time.Second)
		calmed := false
		for !steps[i].done(t) {
			if !alive() {
				return i
			}
			if !time.Now().Before(deadline) && r.calm != nil && !calmed {
				t.Logf("step %q not done within 40s under faults; faults stopped: %s", steps[i].name, r.describe(t))
				r.calm()
				calmed, deadline = true, time.Now().Add(40*time.Second)
			}
			require.True(t, time.Now().Before(deadline), "step %q not done within 40s%s: %s",
				steps[i].name, map[bool]string{true: " after the faults stopped"}[calmed], r.describe(t))
			r.respond(t)
			<-tick.C
		}
	}
	return len(steps)
}

// quiesce waits until nothing is left to do: no claim, no waiting input,
// no unpublished outbox row, no pending permission request, and every
// prompt of the workload answered by a turn event.
func (r *sweepRun) quiesce(t *testing.T, alive func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r.respond(t)
		why := r.busy(t)
		if why == "" {
			return nil
		}
		if !alive() {
			return fmt.Errorf("the process died: %s", why)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not quiescent after 60s: %s", why)
		}
		<-tick.C
	}
}

func (r *sweepRun) busy(t *testing.T) string {
	for _, q := range []struct{ what, sql string }{
		{"claims", `SELECT count(*) FROM claims`},
		{"waiting inputs", `SELECT count(*) FROM inputs WHERE promotion_seq IS NULL AND quarantine_reason IS NULL`},
		{"unpublished outbox rows", `SELECT count(*) FROM outbox WHERE published_at IS NULL AND quarantine_reason IS NULL`},
		{"pending permission requests", `SELECT count(*) FROM permission_requests WHERE status = 'pending'`},
	} {
		if n := r.b.count(t, q.sql); n > 0 {
			return fmt.Sprintf("%d %s", n, q.what)
		}
	}
	for _, p := range r.prompts {
		if len(r.b.events.turnEvents(t, p.MessageID)) == 0 {
			return "no turn event for " + p.MessageID + " (" + p.SessionID + ")"
		}
	}
	return ""
}

// describe says, for a failure message, what is unsettled: the claims,
// the inputs waiting, the unpublished outbox rows and the last recovery
// decisions, as JSON rows.
func (r *sweepRun) describe(t *testing.T) string {
	var out strings.Builder
	for _, q := range []struct{ what, sql string }{
		{"claims", `SELECT row_to_json(c)::text FROM claims c`},
		{"waiting inputs", `SELECT json_build_object('session', session_id, 'kind', kind, 'message', message_id)::text
			FROM inputs WHERE promotion_seq IS NULL AND quarantine_reason IS NULL`},
		{"unpublished outbox rows", `SELECT json_build_object('topic', topic, 'key', key, 'created', created_at)::text
			FROM outbox WHERE published_at IS NULL AND quarantine_reason IS NULL ORDER BY id LIMIT 10`},
		{"pending permission requests", `SELECT json_build_object('session', session_id, 'request', request_id)::text
			FROM permission_requests WHERE status = 'pending'`},
		{"last recoveries", `SELECT row_to_json(x)::text FROM (SELECT session_id, execution_id, phase_found, decision, rule, token_before, token_after, decided_at
			FROM recoveries ORDER BY decided_at DESC LIMIT 8) x`},
	} {
		rows, err := r.b.pool.Query(context.Background(), q.sql)
		if err != nil {
			fmt.Fprintf(&out, "\n%s: %v", q.what, err)
			continue
		}
		fmt.Fprintf(&out, "\n%s:", q.what)
		for rows.Next() {
			var row string
			if err := rows.Scan(&row); err != nil {
				fmt.Fprintf(&out, " %v", err)
				break
			}
			out.WriteString("\n  " + row)
		}
		if err := rows.Err(); err != nil {
			fmt.Fprintf(&out, " %v", err)
		}
		rows.Close()
	}
	return out.String()
}

// violations checks the invariants of docs/testing.md after quiescence and
// returns each one broken, in words.
func (r *sweepRun) violations(t *testing.T) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	events := r.b.events.events(t)

	// Every prompt ends in exactly one turn, answered by one assistant
	// message; no prompt answered twice.
	for _, p := range r.prompts {
		if n := distinctIDs(r.b.events.turnEvents(t, p.MessageID)); n != 1 {
			bad("prompt %s (%s) has %d distinct turn events, want 1", p.MessageID, p.SessionID, n)
		}
		// A turn reconciled while a tool call was in flight ends on that
		// step's message, completed with its tool calls: no final answer.
		if n := r.b.count(t, finalAnswers, p.MessageID); n > 1 {
			bad("prompt %s (%s) is answered %d times (final assistant messages)", p.MessageID, p.SessionID, n)
		}
		for _, e := range r.b.events.turnEvents(t, p.MessageID) {
			if r.b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND role = 'assistant' AND $2 = ANY(answers)`,
				e.AssistantMessageID, p.MessageID) != 1 {
				bad("%s event %s of prompt %s names %q, not an assistant message answering it", e.Type, e.ID, p.MessageID, e.AssistantMessageID)
			}
		}
	}
	// An event names only messages that exist.
	for _, e := range events {
		if e.AssistantMessageID != "" && r.b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1`, e.AssistantMessageID) == 0 {
			bad("%s event %s names assistant message %s, which does not exist", e.Type, e.ID, e.AssistantMessageID)
		}
		for _, id := range append(slices.Clone(e.MessageIDs), e.MessageID) {
			if id != "" && r.b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, id) == 0 {
				bad("%s event %s names input %s, which does not exist", e.Type, e.ID, id)
			}
		}
	}
	out = append(out, sideEffectViolations(t, r.sandbox, r.tools)...)
	out = append(out, stateViolations(t, r.b)...)
	return out
}

// sideEffectViolations checks that no side-effecting call ran twice and
// that an idempotent one ran again only under the same idempotency key.
func sideEffectViolations(t *testing.T, sandbox string, tools *toolServer) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	// A side-effecting call never ran twice: the sandbox file, and the
	// side-effecting endpoint, see each call at most once.
	lines := map[string]int{}
	for _, l := range sandboxLines(t, sandbox, "sweep.txt") {
		lines[l]++
	}
	for l, n := range lines {
		if n > 1 {
			bad("append_line wrote %q %d times", l, n)
		}
	}
	bodies := map[string]int{}
	keys := map[string]map[string]bool{}
	for _, q := range tools.requests() {
		if q.Path == "/side" {
			bodies[q.Body]++
		}
		if keys[q.Body] == nil {
			keys[q.Body] = map[string]bool{}
		}
		keys[q.Body][q.Key] = true
	}
	for body, n := range bodies {
		if n > 1 {
			bad("the side-effecting endpoint received %s %d times", body, n)
		}
	}
	// An idempotent call ran again only with the same idempotency key.
	for body, ks := range keys {
		if len(ks) > 1 {
			bad("the endpoint received %s under %d idempotency keys", body, len(ks))
		}
	}
	return out
}

// stateViolations checks the invariants on Postgres alone, after
// quiescence: terminal states, continuations, quarantines, recoveries.
func stateViolations(t *testing.T, b *testBundle) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	ctx := context.Background()
	// One intent, one outcome: every tool call and attempt is terminal.
	for _, q := range []struct{ what, sql string }{
		{"tool calls not terminal", `SELECT count(*) FROM tool_calls WHERE state NOT IN ('succeeded', 'failed', 'interrupted', 'unknown')`},
		{"attempts not terminal", `SELECT count(*) FROM attempts WHERE state NOT IN ('succeeded', 'failed', 'unknown')`},
		{"assistant messages still pending", `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'pending'`},
		// A continuation of one turn is promoted at most once.
		{"continuations answered twice", `SELECT count(*) FROM (SELECT r.continuation_message_id FROM recoveries r
			JOIN messages m ON r.continuation_message_id = ANY(m.answers) GROUP BY 1 HAVING count(*) > 1) x`},
		// Nothing valid is quarantined: the workload has no invalid row.
		{"quarantined inputs", `SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL`},
		{"quarantined claims", `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`},
		{"quarantined outbox rows", `SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL`},
		{"quarantined recoveries", `SELECT count(*) FROM recoveries WHERE quarantine_reason IS NOT NULL`},
		// A claim whose phase says nothing was in flight is never
		// reconciled as unknown.
		{"reconciled claims that were not in phase unknown", `SELECT count(*) FROM recoveries WHERE decision = 'reconciled' AND phase_found <> 'unknown'`},
		// After quiescence: no claim, no waiting input.
		{"live claims", `SELECT count(*) FROM claims`},
		{"waiting inputs", `SELECT count(*) FROM inputs WHERE promotion_seq IS NULL`},
	} {
		if n := b.count(t, q.sql); n > 0 {
			bad("%d %s", n, q.what)
		}
	}
	var tokensDown int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM recoveries WHERE token_after <= token_before`).Scan(&tokensDown))
	if tokensDown > 0 {
		bad("%d recoveries did not raise the fencing token", tokensDown)
	}
	return out
}

// commitLog reads the commit log a process wrote: line N is "N LABEL".
func commitLog(t *testing.T, path string) []string {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var labels []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		_, label, _ := strings.Cut(sc.Text(), " ")
		labels = append(labels, label)
	}
	require.NoError(t, sc.Err())
	return labels
}

// sweepCase is one (N, side) of the sweep.
type sweepCase struct {
	n    int
	when string
}

func (c sweepCase) String() string { return fmt.Sprintf("%s-%03d", c.when, c.n) }

// sweepCases picks the runs: see the comment at the top of this file;
// runs is the size of the leg's default sample.
// A leg's own variable (CRASH_SWEEP_HTTP for the HTTP leg, with its _RUNS
// and _SEED), when set, chooses that leg's runs instead.
func sweepCases(t *testing.T, leg sweepLeg, k int) ([]sweepCase, string) {
	env := "CRASH_SWEEP"
	if leg.env != "" && os.Getenv(leg.env) != "" {
		env = leg.env
	}
	return pickCases(t, k, env, []string{"before", "after"}, leg.sample)
}

// pickCases picks the runs of a sweep over k commits, each commit once per
// side, as the variable env says (sample, full or every:K; env+"_RUNS" is
// the sample's size, default runs; env+"_SEED" its seed).
func pickCases(t *testing.T, k int, env string, sides []string, runs int) ([]sweepCase, string) {
	var all []sweepCase
	for n := 1; n <= k; n++ {
		for _, side := range sides {
			all = append(all, sweepCase{n, side})
		}
	}
	mode := cmp.Or(os.Getenv(env), "sample")
	switch {
	case mode == "full":
		return all, "full"
	case strings.HasPrefix(mode, "every:"):
		every, err := strconv.Atoi(strings.TrimPrefix(mode, "every:"))
		require.NoError(t, err, "%s=%s", env, mode)
		var out []sweepCase
		for _, c := range all {
			if c.n%every == 1 || every == 1 {
				out = append(out, c)
			}
		}
		return out, mode
	case mode == "sample":
		if s := os.Getenv(env + "_RUNS"); s != "" {
			var err error
			runs, err = strconv.Atoi(s)
			require.NoError(t, err, env+"_RUNS")
		}
		seed := uint64(time.Now().UnixNano())
		if s := os.Getenv(env + "_SEED"); s != "" {
			var err error
			seed, err = strconv.ParseUint(s, 10, 64)
			require.NoError(t, err, env+"_SEED")
		}
		rng := rand.New(rand.NewPCG(seed, seed))
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		out := all[:min(runs, len(all))]
		slices.SortFunc(out, func(a, b sweepCase) int { return cmp.Or(cmp.Compare(a.n, b.n), cmp.Compare(a.when, b.when)) })
		return out, fmt.Sprintf("sample of %d, %s_SEED=%d", len(out), env, seed)
	default:
		require.FailNow(t, env+": want sample, full or every:K", "got %q", mode)
		return nil, ""
	}
}

// sweepLeg is one provider the workload runs against; each leg has its
// own workload, its own K and its own runs.
type sweepLeg struct {
	name   string
	newRun func(t *testing.T) *sweepRun
	sample int    // runs of the default sample
	env    string // the leg's own CRASH_SWEEP variable, if any
}

// TestCrashSweep runs each leg: the rich workload with the scripted
// provider (which honours no idempotency key), and a workload of provider
// steps with the HTTP provider against a server that honours them.
func TestCrashSweep(t *testing.T) {
	testkit.SkipInShortTier(t, longRunning)
	t.Parallel()
	for _, leg := range []sweepLeg{
		{name: legScripted, newRun: newSweepRun, sample: 6},
		{name: legHTTP, newRun: newHTTPSweepRun, sample: 2, env: "CRASH_SWEEP_HTTP"},
	} {
		t.Run(leg.name, func(t *testing.T) {
			t.Parallel()
			sweepLegRuns(t, leg)
		})
	}
}

// sweepLegRuns runs the leg's workload once to count its commits (K), then
// once per chosen (N, side), killing the consumer at that commit.
func sweepLegRuns(t *testing.T, leg sweepLeg) {
	started := time.Now()

	// The counting run: nothing is killed, and the invariants hold.
	var k int
	var labels []string
	t.Run("count", func(t *testing.T) {
		r := leg.newRun(t)
		log := filepath.Join(t.TempDir(), "commits")
		steps := r.legSteps()
		p := r.b.startEnv(t, "consumer", []string{"PROMPTLINE_FAULT_COMMIT_LOG=" + log}, r.legFlags()...)
		require.Equal(t, len(steps), r.drive(t, steps, 0, false, p.running), "the counting run died: %s", p.stderr.String())
		require.NoError(t, r.quiesce(t, p.running))
		require.Empty(t, append(r.violations(t), r.providerViolations(t)...), "the invariants hold without a crash")
		labels = commitLog(t, log)
		k = len(labels)
		require.Greater(t, k, 20, "the workload commits its writes through the tracer")
	})
	if t.Failed() {
		return
	}
	cases, how := sweepCases(t, leg, k)

	type result struct {
		c          sweepCase
		label      string
		died       bool
		step       string
		violations []string
		resent     int        // provider steps sent again after the crash, under their key
		t          *testing.T // the run's test: it may fail after its result (a process's clean-up)
	}
	var mu sync.Mutex
	var results []result
	t.Run("runs", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.String(), func(t *testing.T) {
				t.Parallel()
				r := leg.newRun(t)
				log := filepath.Join(t.TempDir(), "commits")
				steps := r.legSteps()
				flags := r.legFlags()
				crashing := r.b.startEnv(t, "consumer-1", []string{
					"PROMPTLINE_FAULT_COMMIT=" + fmt.Sprintf("%d:%s", c.n, c.when), "PROMPTLINE_FAULT_COMMIT_LOG=" + log,
				}, flags...)
				at := r.drive(t, steps, 0, false, crashing.running)
				res := result{c: c, step: "after the last step", t: t}
				if at < len(steps) {
					res.step = steps[at].name
				}
				if at == len(steps) && crashing.running() {
					// Every step is done: the process may still reach its
					// commit while the system settles (a relay mark, a
					// recovery pass), or this run may commit fewer times.
					_ = r.quiesce(t, crashing.running)
				}
				l := commitLog(t, log)
				if len(l) >= c.n {
					res.label = l[c.n-1]
					requireKilled(t, crashing.waitExit(t, crashTimeout))
				} else {
					// Not reached: this run committed fewer times than the
					// counting run (group commit merges more under load, and
					// the settling after the last step varies), which only
					// the last commits' numbers meet. A tracer that lost the
					// commits would look the same at any number; it shows
					// here as a log far shorter than the counting run's.
					require.GreaterOrEqual(t, len(l), k/4,
						"commit %d not reached, and the run logged %d commits of the counting run's %d: the tracer lost them", c.n, len(l), k)
				}
				if !crashing.running() {
					requireKilled(t, crashing.waitExit(t, crashTimeout))
					res.died = true
					r.b.start(t, "consumer-2", "", flags...)
					r.drive(t, steps, at, at < len(steps), func() bool { return true })
				}
				if err := r.quiesce(t, func() bool { return true }); err != nil {
					res.violations = append(res.violations, err.Error())
				} else {
					res.violations = append(r.violations(t), r.providerViolations(t)...)
				}
				if r.provider != nil {
					res.resent = r.provider.resentAfterCrash()
				}
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
				require.Empty(t, res.violations, "killed %s commit %d (%s) during step %q", c.when, c.n, res.label, res.step)
			})
		}
	})

	died, failed, resent := 0, 0, 0
	var report strings.Builder
	slices.SortFunc(results, func(a, b result) int {
		return cmp.Or(cmp.Compare(a.c.n, b.c.n), cmp.Compare(a.c.when, b.c.when))
	})
	for _, res := range results {
		if res.died {
			died++
		}
		resent += res.resent
		switch {
		case len(res.violations) > 0:
			failed++
			fmt.Fprintf(&report, "  FAIL %s during %q at %q: %s\n", res.c, res.step, res.label, strings.Join(res.violations, "; "))
		case res.t.Failed():
			// No invariant broken, yet the run failed: a process that did
			// not stop cleanly, a clean-up; its own log says what.
			failed++
			fmt.Fprintf(&report, "  FAIL %s during %q at %q: the run's test failed with no invariant broken (see its log)\n", res.c, res.step, res.label)
		}
	}
	var extra string
	if leg.name == legHTTP {
		extra = fmt.Sprintf(", %d provider steps sent again after a crash under their key", resent)
	}
	t.Logf("crash sweep: leg %s, K=%d commits, %s: %d runs, %d died at their commit (the others committed fewer times), %d failed%s, %s\n%s",
		leg.name, k, how, len(results), died, failed, extra, time.Since(started).Round(time.Second), report.String())
	// Every run either reached its commit and was killed there
	// (requireKilled) or logged most of the counting run's commits (above),
	// so a sweep whose fault or tracer is broken fails run by run. A small
	// sample (make test's) may draw only the last commits, which a run
	// under load does not always reach; a whole sweep must have killed.
	if len(results) == len(cases) && how == "full" {
		require.Positive(t, died, "no run died at its commit: the sweep tested nothing")
	}
}

// count counts the rejects-topic records whose headers match.
func (r *topicReader) count(t *testing.T, match func(headers map[string]string) bool) int {
	t.Helper()
	n := 0
	for _, m := range r.All() {
		h := map[string]string{}
		for _, x := range m.Headers {
			h[string(x.Key)] = string(x.Value)
		}
		if match(h) {
			n++
		}
	}
	return n
}
