package main

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/testkit"
)

// The ledger (issue "ledger") on real processes: a side-effecting tool
// call killed between its intent and its dispatch, and the provider
// failures that decide what a step may do next (docs/providers.md, "What
// promptline retries"), against a provider served by the test.

// sandboxLines returns the lines of file in the append_line sandbox dir;
// none when the file does not exist.
func sandboxLines(t *testing.T, dir, file string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func countOf(lines []string, line string) int {
	n := 0
	for _, l := range lines {
		if l == line {
			n++
		}
	}
	return n
}

// TestCrashAfterSideEffectingToolIntent kills the consumer between the
// intent of a side-effecting call (append_line) and its dispatch. After a
// restart and a recovery pass the call is unknown and never run again: the
// line it would append is not in the file after recovery, nor after a
// later prompt of the session ran; the turn failed with reason
// outcome_unknown; the session is not blocked.
//
// It catches: recovery (or a continuation) replaying a side-effecting call
// (P4), a reconcile that leaves the call started or requested, a missing
// turn.failed, and a session left stuck behind the reconciled claim
// (invariant 7).
func TestCrashAfterSideEffectingToolIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-tool-intent"
	sandbox := t.TempDir()
	first := prompt(session, `/tool append_line {"file":"log.txt","line":"once"}`)
	later := prompt(session, "later")

	crashing := b.start(t, "consumer-1", faults.ToolAfterIntent, "--lease", "1s", "--sandbox-dir", sandbox)
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls
		WHERE session_id = $1 AND tool = 'append_line' AND class = 'side_effecting' AND state = 'started'`, session),
		"the call's intent was committed before the crash")
	// At most one line, ever; and as the crash point sits between the
	// intent and the dispatch, none: any line from here on is a replay.
	require.Zero(t, countOf(sandboxLines(t, sandbox, "log.txt"), "once"), "the crash came before the dispatch")

	b.start(t, "consumer-2", "", "--lease", "1s", "--recovery-interval", "300ms", "--sandbox-dir", sandbox)
	failed := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Zero(t, countOf(sandboxLines(t, sandbox, "log.txt"), "once"), "recovery must not run the call again")

	b.send(t, later)
	done := b.events.waitTurn(t, later.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, done.Type, "a later prompt of the session runs: %+v", done)
	require.Equal(t, "echo: later", done.Text)
	require.Zero(t, countOf(sandboxLines(t, sandbox, "log.txt"), "once"), "the later turn must not run the call either")

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, session), "no second call")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'unknown' AND is_error`, session),
		"the call is unknown")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'reconciled'`, session))
	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, first.MessageID)), "one turn event for the first prompt")
	require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventTurnFailed), "one turn.failed written")
}

// stepServer is a model service speaking docs/providers.md's contract,
// scripted per request: respond gets the request's 0-based index.
type stepServer struct {
	url     string
	respond func(n int, w http.ResponseWriter)

	mu   sync.Mutex
	reqs []stepRequest
}

// stepRequest is what the server saw of one POST.
type stepRequest struct {
	key       string // Idempotency-Key header
	fencing   string // X-Fencing-Token header
	attemptID string
	sessionID string
	at        time.Time
}

func newStepServer(t *testing.T, respond func(n int, w http.ResponseWriter)) *stepServer {
	t.Helper()
	s := &stepServer{respond: respond}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the whole request first: a failure after this point is one
		// the server may have acted on.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req struct {
			SessionID string `json:"session_id"`
			AttemptID string `json:"attempt_id"`
		}
		if err := json.Unmarshal(body, &req); err != nil || r.Method != http.MethodPost {
			http.Error(w, "want a POST of a JSON step", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, stepRequest{key: r.Header.Get("Idempotency-Key"), fencing: r.Header.Get("X-Fencing-Token"),
			attemptID: req.AttemptID, sessionID: req.SessionID, at: time.Now()})
		s.mu.Unlock()
		s.respond(n, w)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/v1/step"
	return s
}

func (s *stepServer) requests() []stepRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stepRequest(nil), s.reqs...)
}

func answerOK(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"text": "ok"}`)
}

// dropConnection closes the connection without an answer, after the
// request was read: the provider cannot know whether the step was acted on.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err) // HTTP/1.1 test server: hijacking is supported
	}
	_ = conn.Close()
}

// attemptOf reads the only provider attempt of a session.
func attemptOf(t *testing.T, b *testBundle, session string) (key, state, errText string, tries int) {
	t.Helper()
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session), "one attempt row")
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT idempotency_key, state, coalesce(error, ''), tries FROM attempts WHERE session_id = $1`,
		session).Scan(&key, &state, &errText, &tries))
	return key, state, errText, tries
}

// TestHTTPProviderDroppedConnection: the provider reads the first request
// whole and drops the connection without answering, so the step's outcome
// is unknown; later requests are answered.
func TestHTTPProviderDroppedConnection(t *testing.T) {
	t.Parallel()
	respond := func(n int, w http.ResponseWriter) {
		if n == 0 {
			dropConnection(w)
			return
		}
		answerOK(w)
	}

	// With --provider-honours-idempotency-keys the step is sent again with
	// the same key and the turn completes. It catches: no retry for a
	// declared idempotent provider, a retry with a new key (the server
	// could not deduplicate it), and more than one retry.
	t.Run("HonoursIdempotencyKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const session = "s-http-drop-idem"
		srv := newStepServer(t, respond)
		p := prompt(session, "hello")
		b.start(t, "consumer", "", "--provider", "http", "--provider-url", srv.url, "--provider-honours-idempotency-keys")
		b.send(t, p)
		turn := b.events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
		require.Equal(t, "ok", turn.Text)

		reqs := srv.requests()
		require.Len(t, reqs, 2, "the dropped step and its one retry")
		key, state, _, tries := attemptOf(t, b, session)
		for _, r := range reqs {
			require.Equal(t, key, r.key, "every send of the step carries the attempt's idempotency key")
			require.Equal(t, reqs[0].attemptID, r.attemptID, "the retry is the same attempt")
		}
		require.NotEmpty(t, key)
		require.Equal(t, "succeeded", state)
		require.Equal(t, 2, tries)
	})

	// Without the declaration nothing is sent again: the attempt is unknown
	// and the turn fails with reason outcome_unknown. It catches a retry of
	// an uncertain step (by the executor or silently by net/http) and an
	// uncertain step misclassified as failed or not sent.
	t.Run("WithoutIdempotencyKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const session = "s-http-drop"
		srv := newStepServer(t, respond)
		p := prompt(session, "hello")
		b.start(t, "consumer", "", "--provider", "http", "--provider-url", srv.url)
		b.send(t, p)
		turn := b.events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnFailed, turn.Type, "%+v", turn)
		require.Equal(t, envelope.FailOutcomeUnknown, turn.Reason)

		// The turn is settled: nothing can send the step any more.
		reqs := srv.requests()
		require.Len(t, reqs, 1, "an uncertain step is never sent again")
		key, state, _, _ := attemptOf(t, b, session)
		require.Equal(t, key, reqs[0].key, "the key is sent even when not honoured")
		require.Equal(t, "unknown", state)
		require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'errored'`, p.MessageID))
	})
}

// TestHTTPProviderRetryAfter: a 429 with Retry-After: 1 refuses the step
// without acting on it, so it is sent again after the delay (without any
// idempotency declaration), with the same key, counted durably on the
// attempt (tries = 2).
//
// It catches: a 429 failing the turn, a retry before the delay, a retry
// under a new key or a new attempt, and tries not recorded.
func TestHTTPProviderRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-http-429"
	srv := newStepServer(t, func(n int, w http.ResponseWriter) {
		if n == 0 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		answerOK(w)
	})
	p := prompt(session, "hello")
	b.start(t, "consumer", "", "--provider", "http", "--provider-url", srv.url)
	b.send(t, p)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "ok", turn.Text)

	reqs := srv.requests()
	require.Len(t, reqs, 2, "the refused step and its retry")
	key, state, _, tries := attemptOf(t, b, session)
	require.Equal(t, key, reqs[0].key)
	require.Equal(t, key, reqs[1].key, "the retry carries the same key")
	require.Equal(t, reqs[0].attemptID, reqs[1].attemptID)
	require.GreaterOrEqual(t, reqs[1].at.Sub(reqs[0].at), 900*time.Millisecond, "Retry-After: 1 is honoured")
	require.Equal(t, "succeeded", state)
	require.Equal(t, 2, tries, "SELECT tries FROM attempts")
}

// TestHTTPProviderIdempotentRetryClasses: with
// --provider-honours-idempotency-keys a failed step is sent again under the
// same key, unless the server refused the request itself: a 400 (or 401,
// 404, ...) would be refused again, so the turn fails at once with reason
// provider_error; a 500 is retried and the turn completes.
//
// It catches: a refused request sent again (five wasted sends, a second of
// delay, and a bad key tried six times), and a server fault no longer
// retried.
func TestHTTPProviderIdempotentRetryClasses(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		status    int
		wantSends int
		wantType  string
		wantState string
	}{
		"BadRequestNotRetried": {status: http.StatusBadRequest, wantSends: 1, wantType: envelope.EventTurnFailed, wantState: "failed"},
		"ServerErrorRetried":   {status: http.StatusInternalServerError, wantSends: 2, wantType: envelope.EventTurnCompleted, wantState: "succeeded"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			session := "s-http-class-" + strconv.Itoa(tc.status)
			srv := newStepServer(t, func(n int, w http.ResponseWriter) {
				if n == 0 {
					http.Error(w, `{"error":"no"}`, tc.status)
					return
				}
				answerOK(w)
			})
			p := prompt(session, "hello")
			b.start(t, "consumer", "", "--provider", "http", "--provider-url", srv.url, "--provider-honours-idempotency-keys")
			b.send(t, p)
			turn := b.events.waitTurn(t, p.MessageID)
			require.Equal(t, tc.wantType, turn.Type, "%+v", turn)
			if tc.wantType == envelope.EventTurnFailed {
				require.Equal(t, envelope.FailProviderError, turn.Reason)
				require.Contains(t, turn.Error, strconv.Itoa(tc.status))
			}

			require.Len(t, srv.requests(), tc.wantSends)
			_, state, _, tries := attemptOf(t, b, session)
			require.Equal(t, tc.wantState, state)
			require.Equal(t, tc.wantSends, tries, "SELECT tries FROM attempts")
		})
	}
}

// TestHTTPProviderMalformedResponse: a 200 whose body is not JSON is an
// answer (the server acted) that cannot be used: the attempt is failed, the
// turn fails with reason provider_error, and the consumer goes on with the
// session's next prompt.
//
// It catches: a malformed answer taken as unknown or retried, a stored
// half-answer, and a consumer that crashes or wedges on bad provider data
// (P6).
func TestHTTPProviderMalformedResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-http-malformed"
	srv := newStepServer(t, func(n int, w http.ResponseWriter) {
		if n == 0 {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "not json")
			return
		}
		answerOK(w)
	})
	first, later := prompt(session, "first"), prompt(session, "later")
	c := b.start(t, "consumer", "", "--provider", "http", "--provider-url", srv.url)
	b.send(t, first)
	turn := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnFailed, turn.Type, "%+v", turn)
	require.Equal(t, envelope.FailProviderError, turn.Reason)
	require.Contains(t, turn.Error, "malformed response")
	require.Len(t, srv.requests(), 1, "a malformed answer is not retried")
	_, state, errText, _ := attemptOf(t, b, session)
	require.Equal(t, "failed", state)
	require.Contains(t, errText, "malformed response")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'errored'`, first.MessageID))

	b.send(t, later)
	next := b.events.waitTurn(t, later.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, next.Type, "%+v", next)
	require.Equal(t, "ok", next.Text)
	require.True(t, c.running(), "the consumer still runs")
}

// TestCrashDuringProviderBackoff: the provider refused the first send with
// 429 and Retry-After: 3; the test SIGKILLs the consumer while it waits
// (attempt retry_wait, claim phase ready, the input promoted, the assistant
// message pending). No fault point lies in this window, so the test kills
// the process itself once the deferral is committed. After a restart and a
// recovery pass the turn must end, once: the refused step certainly was
// not acted on, so it may be sent again (once), each send recorded in the
// ledger before it leaves.
//
// It catches a "durable" backoff that is not: recovery taking the ready
// claim for "nothing promoted yet" and clearing it with no wake and no
// continuation, so that the promoted prompt is never answered nor failed
// (P1).
func TestCrashDuringProviderBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-http-backoff"
	srv := newStepServer(t, func(n int, w http.ResponseWriter) {
		if n == 0 {
			w.Header().Set("Retry-After", "3")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		answerOK(w)
	})
	p := prompt(session, "hello")
	provider := []string{"--provider", "http", "--provider-url", srv.url}

	c := b.start(t, "consumer-1", "", append([]string{"--lease", "1s"}, provider...)...)
	b.send(t, p)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'retry_wait'`, session) == 1
	}, crashTimeout, 20*time.Millisecond, "the refused step is deferred")
	require.NoError(t, c.cmd.Process.Kill())
	requireKilled(t, c.waitExit(t, crashTimeout))
	require.Len(t, srv.requests(), 1, "killed inside the backoff, before the retry")
	require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'pending'`, p.MessageID))

	b.start(t, "consumer-2", "", append(provider, recoveryFlags...)...)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session) > 0
	}, crashTimeout, 20*time.Millisecond, "recovery decides on the expired claim")
	require.Eventually(t, func() bool { return len(b.events.turnEvents(t, p.MessageID)) > 0 }, 30*time.Second, 20*time.Millisecond,
		"the promoted prompt is never answered nor failed after the crash in the backoff (recovery decided %q; attempt %v; assistant message %q)",
		scalar(t, b, `SELECT decision FROM recoveries WHERE session_id = $1`, session),
		scalar(t, b, `SELECT state FROM attempts WHERE session_id = $1`, session),
		scalar(t, b, `SELECT status FROM messages WHERE role = 'assistant' AND $1 = ANY(answers)`, p.MessageID))

	require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "one turn")
	reqs := srv.requests()
	require.LessOrEqual(t, len(reqs), 2, "sent again at most once")
	for _, r := range reqs {
		// The refused send was certainly not acted on: the resend may keep
		// its attempt and key or be a new attempt, but every send is one
		// the ledger recorded before it left.
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND idempotency_key = $2`, session, r.key),
			"request with key %q has no attempt row", r.key)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state IN ('started', 'retry_wait')`, session),
		"no attempt left in flight")
}

// scalar reads one text value (for failure messages); "" when no row.
func scalar(t *testing.T, b *testBundle, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(t.Context(), sql, args...).Scan(&s); err != nil {
		return "<" + err.Error() + ">"
	}
	return s
}
