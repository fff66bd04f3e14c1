package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// The crash sweep's second leg (docs/testing.md): the consumer runs with
// the HTTP provider (docs/providers.md) against providerServer, which
// honours idempotency keys, and declares it with
// --provider-honours-idempotency-keys. An uncertain provider step is then
// sent again with its key, after a crash too: the invariants of this leg
// say that such a step was never acted on under two keys and that no turn
// ended outcome_unknown.

// providerServer is a model service that honours Idempotency-Key: the
// first request under a key generates the answer (deterministically, from
// the turn's prompt) and stores it; a later request under the same key is
// a replay: the stored answer, generated nothing. It records every request.
type providerServer struct {
	mu     sync.Mutex
	stored map[string]providerAnswer // by Idempotency-Key
	busy   map[string]bool           // assistant messages refused once with 503
	reqs   []providerRequest
}

type providerAnswer struct {
	status int
	body   string
}

// providerRequest is one request as the server saw it.
type providerRequest struct {
	Key, AttemptID, AssistantID, SessionID string
	// Refused: answered 503 before doing anything (not acted on, not
	// stored); Replay: answered from the store.
	Refused, Replay bool
}

func newProviderServer(t *testing.T) (*providerServer, string) {
	s := &providerServer{stored: map[string]providerAnswer{}, busy: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return s, srv.URL + "/v1/step"
}

// providerStepBody is the part of the HTTP provider's request the script reads.
type providerStepBody struct {
	SessionID          string   `json:"session_id"`
	AssistantMessageID string   `json:"assistant_message_id"`
	AttemptID          string   `json:"attempt_id"`
	TurnMessageIDs     []string `json:"turn_message_ids"`
	Messages           []struct {
		ID   string `json:"id"`
		Role string `json:"role"`
		Text string `json:"text"`
	} `json:"messages"`
}

func (s *providerServer) serve(w http.ResponseWriter, r *http.Request) {
	var req providerStepBody
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	rec := providerRequest{Key: key, AttemptID: req.AttemptID, AssistantID: req.AssistantMessageID, SessionID: req.SessionID}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, replay := s.stored[key]
	switch {
	case replay:
		rec.Replay = true
	case strings.HasPrefix(promptOf(req), "/busy") && !s.busy[req.AssistantMessageID]:
		// Refused before doing anything: retried under any key.
		s.busy[req.AssistantMessageID] = true
		rec.Refused = true
		a = providerAnswer{status: http.StatusServiceUnavailable, body: `{"error":"busy"}`}
		w.Header().Set("Retry-After", "1")
	default:
		a = generate(req)
		s.stored[key] = a
	}
	s.reqs = append(s.reqs, rec)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

// promptOf is the text of the turn's first prompt.
func promptOf(req providerStepBody) string {
	for _, m := range req.Messages {
		if m.Role == "user" && slices.Contains(req.TurnMessageIDs, m.ID) {
			return m.Text
		}
	}
	return ""
}

// generate is the script: "/idem CALL" asks for the idempotent endpoint
// once, then answers; "/fail" fails with a 500 (stored, as such a server
// stores the outcome of a request it started on: every retry under the
// key sees it again); anything else is answered at once.
func generate(req providerStepBody) providerAnswer {
	prompt := promptOf(req)
	toolResult := len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == "tool"
	switch {
	case strings.HasPrefix(prompt, "/fail"):
		return providerAnswer{status: http.StatusInternalServerError, body: `{"error":"the model failed"}`}
	case strings.HasPrefix(prompt, "/idem ") && !toolResult:
		input, _ := json.Marshal(map[string]any{"endpoint": "idem", "body": map[string]string{"call": strings.TrimPrefix(prompt, "/idem ")}})
		return providerAnswer{status: http.StatusOK, body: fmt.Sprintf(`{"tool_calls":[{"id":"call-1","name":"http_request","input":%s}]}`, input)}
	}
	text, _ := json.Marshal("answer to " + prompt)
	return providerAnswer{status: http.StatusOK, body: fmt.Sprintf(`{"text":%s}`, text)}
}

func (s *providerServer) requests() []providerRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// httpSweepFlags are the flags of the HTTP leg: the HTTP provider,
// declared to honour idempotency keys, and the idempotent endpoint of the
// http_request tool.
func httpSweepFlags(providerURL, toolURL string) []string {
	return []string{
		"--lease", "2s", "--recovery-interval", "300ms", "--redrive-after", "2s",
		"--provider", "http", "--provider-url", providerURL, "--provider-honours-idempotency-keys",
		"--http-tool-endpoint", "name=idem,url=" + toolURL + "/idem,class=idempotent",
	}
}

func newHTTPSweepRun(t *testing.T) *sweepRun {
	r := newSweepRun(t)
	r.leg = legHTTP
	r.provider, r.providerURL = newProviderServer(t)
	return r
}

// httpSteps is the HTTP leg's workload: provider steps of every kind the
// server answers (an answer, a tool call and the step after it, a refusal
// retried after its delay, a failure retried under its key until the turn
// fails), each exposed to a crash around its commits.
func (r *sweepRun) httpSteps() []sweepStep {
	var steps []sweepStep
	turn := func(p envelope.Prompt) func(t *testing.T) bool {
		return func(t *testing.T) bool { return len(r.b.events.turnEvents(t, p.MessageID)) > 0 }
	}
	for _, s := range []struct{ name, session, text string }{
		{"a plain prompt", "plain", "hello"},
		{"a tool call, then the step that answers its result", "idem", "/idem provider-" + r.tag},
		{"a step refused with 503, retried after Retry-After", "busy", "/busy"},
		{"a provider failure, retried under its key", "fail", "/fail"},
		{"a later prompt of the first session", "plain", "after all that"},
	} {
		p := envelope.Prompt{MessageID: "m-" + uuid.NewString(), SessionID: r.session(s.session), Text: s.text}
		r.prompts = append(r.prompts, p)
		steps = append(steps, sweepStep{name: s.name, send: func(t *testing.T) { r.b.send(t, p) }, done: turn(p)})
	}
	return steps
}

// Legs of the sweep.
const (
	legScripted = "scripted" // the scripted provider, which honours no key
	legHTTP     = "http-idempotent"
)

// providerViolations checks the leg's provider invariants.
func (r *sweepRun) providerViolations(t *testing.T) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if r.provider == nil {
		// A provider that does not honour keys: an uncertain attempt is
		// never sent again (not under its key, not in its message), and
		// recovery never chose to resend one.
		for _, q := range []struct{ what, sql string }{
			{"unknown attempts followed by another attempt of the same step", `SELECT count(*) FROM attempts a WHERE a.state = 'unknown'
				AND EXISTS (SELECT 1 FROM attempts b WHERE b.attempt_id <> a.attempt_id
					AND (b.idempotency_key = a.idempotency_key OR b.assistant_message_id = a.assistant_message_id))`},
			{"recoveries that resent an attempt of a provider that honours no key", `SELECT count(*) FROM recoveries WHERE retry_attempt_id IS NOT NULL`},
		} {
			if n := r.b.count(t, q.sql); n > 0 {
				bad("%d %s", n, q.what)
			}
		}
		return out
	}
	// A provider that honours keys: no step acted on under two keys (a
	// step is its assistant message; a 503 refusal did nothing), and every
	// key names one step.
	keys := map[string]map[string]bool{}
	steps := map[string]map[string]bool{}
	for _, q := range r.provider.requests() {
		if q.Refused {
			continue
		}
		if keys[q.AssistantID] == nil {
			keys[q.AssistantID] = map[string]bool{}
		}
		keys[q.AssistantID][q.Key] = true
		if steps[q.Key] == nil {
			steps[q.Key] = map[string]bool{}
		}
		steps[q.Key][q.AssistantID] = true
	}
	for id, ks := range keys {
		if len(ks) > 1 {
			bad("the provider acted on step %s under %d idempotency keys %v", id, len(ks), slices.Sorted(maps.Keys(ks)))
		}
	}
	for k, ids := range steps {
		if len(ids) > 1 {
			bad("idempotency key %s was sent for %d steps", k, len(ids))
		}
	}
	// The retry is safe, so no crash makes a turn outcome_unknown: no
	// turn.failed for it, no reconciled recovery, and every unknown
	// attempt is one recovery sent again.
	for _, e := range r.b.events.events(t) {
		if e.Type == envelope.EventTurnFailed && e.Reason == envelope.FailOutcomeUnknown {
			bad("turn %s of %s failed %s with a provider that honours idempotency keys", e.AssistantMessageID, e.SessionID, e.Reason)
		}
	}
	for _, q := range []struct{ what, sql string }{
		{"reconciled recoveries", `SELECT count(*) FROM recoveries WHERE decision = 'reconciled'`},
		{"unknown attempts not sent again by recovery", `SELECT count(*) FROM attempts a WHERE a.state = 'unknown'
			AND NOT EXISTS (SELECT 1 FROM recoveries r WHERE r.retry_attempt_id = a.attempt_id)`},
	} {
		if n := r.b.count(t, q.sql); n > 0 {
			bad("%d %s", n, q.what)
		}
	}
	return out
}

// resentAfterCrash counts the keys the provider saw from two executions
// (attempt IDs): steps that recovery sent again after a crash.
func (s *providerServer) resentAfterCrash() int {
	attempts := map[string]map[string]bool{}
	for _, q := range s.requests() {
		if attempts[q.Key] == nil {
			attempts[q.Key] = map[string]bool{}
		}
		attempts[q.Key][q.AttemptID] = true
	}
	n := 0
	for _, a := range attempts {
		if len(a) > 1 {
			n++
		}
	}
	return n
}

func TestProviderServerHonoursKeys(t *testing.T) {
	t.Parallel()
	s, url := newProviderServer(t)
	post := func(key, body string) int {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	body := `{"assistant_message_id":"a-1","attempt_id":"e-1/1","turn_message_ids":["m-1"],"messages":[{"id":"m-1","role":"user","text":"/busy"}]}`
	require.Equal(t, http.StatusServiceUnavailable, post("k-1", body), "the first request of a /busy step is refused")
	require.Equal(t, http.StatusOK, post("k-1", body))
	require.Equal(t, http.StatusOK, post("k-1", strings.Replace(body, "e-1/1", "e-2/1", 1)))
	reqs := s.requests()
	require.Len(t, reqs, 3)
	require.Equal(t, []bool{true, false, false}, []bool{reqs[0].Refused, reqs[1].Refused, reqs[2].Refused})
	require.Equal(t, []bool{false, false, true}, []bool{reqs[0].Replay, reqs[1].Replay, reqs[2].Replay}, "a repeated key is a replay")
	require.Equal(t, 1, s.resentAfterCrash())
}
