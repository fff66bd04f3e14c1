package console_test

import (
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/console"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/metrics"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// testBundle is a real database filled by the real admission, executor
// and recovery, and a console serving it over HTTP.
type testBundle struct {
	pool     *pgxpool.Pool
	admitter *admission.Admitter
	exec     *executor.Executor
	srv      *httptest.Server
	log      *testkit.SyncBuffer
}

const token = "test-token-0123456789"

func setup(t *testing.T, cfg console.Config) *testBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	e, err := executor.NewExecutor(pool, &executor.ExecutorConfig{
		Claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "console-test"}),
		Tools:  reg,
	})
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.StopNow)
	b := &testBundle{pool: pool, admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{}), exec: e, log: testkit.NewSyncBuffer()}
	cfg.Logger = slogTo(b.log)
	if cfg.Registry == nil {
		cfg.Registry = metrics.NewRegistry()
	}
	s, err := console.New(pool, &cfg)
	require.NoError(t, err)
	b.srv = httptest.NewServer(s)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *testBundle) admit(t *testing.T, session, msg, text string) {
	t.Helper()
	out, err := b.admitter.Admit(context.Background(), []admission.Incoming{{
		Prompt: envelope.Prompt{MessageID: msg, SessionID: session, Text: text, Delivery: envelope.DeliveryQueue},
		Source: admission.Source{Topic: "prompts", Partition: 0, Offset: 1},
	}})
	require.NoError(t, err)
	require.Equal(t, []admission.Outcome{admission.Admitted}, out)
}

func (b *testBundle) run(t *testing.T, session string) {
	t.Helper()
	done, err := b.exec.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the session did not go idle within 20s")
	}
}

// quarantineClaim makes recovery quarantine a claim of session: an
// expired claim in a phase recovery does not know (a row a broken writer
// left), decided by a real recovery pass.
func (b *testBundle) quarantineClaim(t *testing.T, session string) {
	t.Helper()
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1) ON CONFLICT DO NOTHING`, session)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ($1, 'e-bogus-'||$1, 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, session)
	require.NoError(t, err)
	_, err = recovery.New(b.pool, &recovery.Config{OwnerID: "console-test-recovery"}).RunOnce(ctx)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason IS NOT NULL`, session).Scan(&n))
	require.Equal(t, 1, n, "recovery quarantined the claim")
}

// get fetches path with the bearer token (when tok is not empty).
func (b *testBundle) get(t *testing.T, path, tok string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func TestPages(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{PageSize: 2})
	const hostile = `<script>alert("x")</script> & <b>bold</b>`
	b.admit(t, "s-script", "m-script", hostile)
	b.run(t, "s-script")
	b.admit(t, "s-tool", "m-tool", `/tool echo {"text":"hi"}`)
	b.run(t, "s-tool")
	for i := range 3 {
		b.admit(t, fmt.Sprintf("s-page-%d", i), fmt.Sprintf("m-page-%d", i), "hello")
	}
	b.quarantineClaim(t, "s-quarantined")

	t.Run("PromptTextIsEscaped", func(t *testing.T) {
		code, body := b.get(t, "/session?id=s-script", "")
		require.Equal(t, http.StatusOK, code, body)
		require.NotContains(t, body, "<script>", "a prompt must never become markup")
		require.Contains(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;")
		require.Contains(t, body, `<svg xmlns="http://www.w3.org/2000/svg" id="timeline"`)
	})

	t.Run("SessionShowsTheLedger", func(t *testing.T) {
		code, body := b.get(t, "/session?id=s-tool", "")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, `<span class="state st-idle" id="session-state">idle</span>`)
		require.Contains(t, body, "tool results: echo: hi", "the transcript's answer")
		require.Regexp(t, `<td>echo</td><td>idempotent</td><td>succeeded</td>`, body, "the tool call of the ledger")
		require.Contains(t, body, `class="attempt succeeded"`, "the timeline colours the attempts by outcome")
		require.Contains(t, body, `class="tool succeeded"`)
	})

	t.Run("SessionsPagedNewestFirst", func(t *testing.T) {
		code, body := b.get(t, "/sessions", "")
		require.Equal(t, http.StatusOK, code)
		// s-quarantined was created last, then s-page-2.
		ids := regexp.MustCompile(`href="/session\?id=([^"]+)"`).FindAllStringSubmatch(body, -1)
		require.Len(t, ids, 2)
		require.Equal(t, "s-quarantined", ids[0][1])
		require.Equal(t, "s-page-2", ids[1][1])
		next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
		require.NotNil(t, next, "a next page link")
		seen := []string{ids[0][1], ids[1][1]}
		for next != nil {
			code, body = b.get(t, strings.ReplaceAll(next[1], "&amp;", "&"), "")
			require.Equal(t, http.StatusOK, code, body)
			for _, m := range regexp.MustCompile(`href="/session\?id=([^"]+)"`).FindAllStringSubmatch(body, -1) {
				seen = append(seen, m[1])
			}
			next = regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
		}
		require.Equal(t, []string{"s-quarantined", "s-page-2", "s-page-1", "s-page-0", "s-tool", "s-script"}, seen)
	})

	t.Run("FilterAndSearch", func(t *testing.T) {
		_, body := b.get(t, "/sessions?state=quarantined", "")
		require.Contains(t, body, `href="/session?id=s-quarantined"`)
		require.NotContains(t, body, `href="/session?id=s-tool"`)
		_, body = b.get(t, "/sessions?state=waiting", "")
		require.Contains(t, body, `href="/session?id=s-page-2"`, "admitted, never run: waiting")
		require.NotContains(t, body, `href="/session?id=s-quarantined"`)
		_, body = b.get(t, "/sessions?q=m-tool", "")
		require.Contains(t, body, `href="/session?id=s-tool"`, "search by message ID")
		require.NotContains(t, body, `href="/session?id=s-script"`)
		code, _ := b.get(t, "/sessions?state=bogus", "")
		require.Equal(t, http.StatusBadRequest, code)
	})

	t.Run("QuarantineAndRecovery", func(t *testing.T) {
		_, body := b.get(t, "/quarantine", "")
		require.Contains(t, body, `<td>claim</td><td>s-quarantined</td>`)
		require.Contains(t, body, "unknown phase")
		_, body = b.get(t, "/recovery?decision=quarantined", "")
		require.Contains(t, body, `href="/session?id=s-quarantined"`)
		_, body = b.get(t, "/session?id=s-quarantined", "")
		require.Contains(t, body, "Decision: quarantined — the row failed validation", "the evidence in recovery explain's words")
		require.Contains(t, body, `class="claim quarantined"`)
	})

	t.Run("TimelineSVG", func(t *testing.T) {
		resp, err := http.Get(b.srv.URL + "/timeline.svg?id=s-tool")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, "image/svg+xml", resp.Header.Get("Content-Type"))
		require.Contains(t, string(body), `<svg xmlns="http://www.w3.org/2000/svg"`)
		require.NotContains(t, string(body), "<script")
		require.NotContains(t, string(body), "http://fonts", "no external font")
	})

	t.Run("AccessLogAndMetrics", func(t *testing.T) {
		require.Contains(t, b.log.String(), `"route":"session"`)
		require.NotContains(t, b.log.String(), "alert(", "the access log carries no prompt text")
		code, body := b.get(t, "/metrics", "")
		require.Equal(t, http.StatusOK, code)
		require.Regexp(t, `promptline_console_requests_total\{code="200",route="session"\} [1-9]`, body)
		require.Contains(t, body, `promptline_console_request_seconds_bucket{route="sessions"`)
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	b.quarantineClaim(t, "s-q")
	ctx := context.Background()
	_, body := b.get(t, "/quarantine", "")
	csrf := csrfRe.FindStringSubmatch(body)
	require.NotNil(t, csrf)
	post := func(form url.Values, origin string) (int, string, string) {
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/quarantine/release", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out), resp.Header.Get("Location")
	}
	form := url.Values{"kind": {"claim"}, "id": {"s-q"}, "operator": {"alice"}, "note": {"phase set to safe"}, "csrf": {csrf[1]}}

	t.Run("CrossSiteRefused", func(t *testing.T) {
		code, _, _ := post(form, "http://evil.example")
		require.Equal(t, http.StatusForbidden, code)
		noToken := url.Values{"kind": {"claim"}, "id": {"s-q"}, "operator": {"alice"}}
		code, _, _ = post(noToken, "")
		require.Equal(t, http.StatusForbidden, code, "no CSRF token")
	})

	t.Run("StillInvalidIsNotReleased", func(t *testing.T) {
		code, body, _ := post(form, b.srv.URL)
		require.Equal(t, http.StatusConflict, code, body)
		require.Contains(t, body, "still fails validation")
	})

	// The operator repairs the row (the runbook: the turn is complete).
	_, err := b.pool.Exec(ctx, `UPDATE claims SET phase = 'safe' WHERE session_id = 's-q'`)
	require.NoError(t, err)
	code, _, loc := post(form, b.srv.URL)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, loc, "/quarantine?released=")
	_, body = b.get(t, "/quarantine", "")
	require.Contains(t, body, "Nothing is quarantined.")
	var by, note string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT released_by, note FROM quarantine_releases WHERE kind = 'claim' AND ref = 's-q'`).Scan(&by, &note))
	require.Equal(t, "alice", by)
	require.Equal(t, "phase set to safe", note)
	_, body = b.get(t, "/session?id=s-q", "")
	require.Contains(t, body, `class="release"`, "the timeline shows the release")
}

// TestLeaseNotATime: the session page and its timeline show a claim
// whose lease is not a time, the row an operator must inspect and
// repair before releasing it (docs/runbook.md).
func TestLeaseNotATime(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	b.quarantineClaim(t, "s-q")
	for _, v := range []string{"-infinity", "infinity"} {
		_, err := b.pool.Exec(t.Context(), `UPDATE claims SET expires_at = $1::timestamptz WHERE session_id = 's-q'`, v)
		require.NoError(t, err)
		code, body := b.get(t, "/session?id=s-q", "")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "<td>"+v+"</td>", "the lease as stored")
		code, body = b.get(t, "/timeline.svg?id=s-q", "")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "lease until "+v)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()

	t.Run("Token", func(t *testing.T) {
		t.Parallel()
		b := setup(t, console.Config{Token: token})
		code, _ := b.get(t, "/sessions", "")
		require.Equal(t, http.StatusSeeOther, code, "to the login form")
		code, _ = b.get(t, "/sessions", "wrong-token-0123456789")
		require.Equal(t, http.StatusSeeOther, code)
		code, _ = b.get(t, "/sessions", token)
		require.Equal(t, http.StatusOK, code)

		resp, err := noRedirect.PostForm(b.srv.URL+"/login", url.Values{"token": {"nope"}, "next": {"/quarantine"}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		resp, err = noRedirect.PostForm(b.srv.URL+"/login", url.Values{"token": {token}, "next": {"//evil.example/"}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/sessions", resp.Header.Get("Location"), "never back to another site")
		var cookie *http.Cookie
		for _, c := range resp.Cookies() {
			if c.Name == "promptline_console" {
				cookie = c
			}
		}
		require.NotNil(t, cookie)
		require.True(t, cookie.HttpOnly)
		require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
		require.NotContains(t, cookie.Value, token, "the cookie holds no token")
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/sessions", nil)
		req.AddCookie(cookie)
		resp, err = noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	})

	t.Run("NoTokenLoopbackNamesOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, console.Config{})
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/sessions", nil)
		req.Host = "rebound.example:80"
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "a DNS-rebinding page must not read the console")
	})

	t.Run("CheckAddr", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, console.CheckAddr("127.0.0.1:9470", false))
		require.NoError(t, console.CheckAddr("[::1]:9470", false))
		require.NoError(t, console.CheckAddr("localhost:9470", false))
		require.ErrorIs(t, console.CheckAddr("0.0.0.0:9470", false), console.ErrNonLoopback)
		require.ErrorIs(t, console.CheckAddr(":9470", false), console.ErrNonLoopback)
		require.ErrorIs(t, console.CheckAddr("10.1.2.3:9470", false), console.ErrNonLoopback)
		require.NoError(t, console.CheckAddr("0.0.0.0:9470", true))
	})
}

// TestHostileInput sends what a browser never would: text that is not
// UTF-8 (or holds NUL, which Postgres text cannot hold) and a body far
// larger than any of the console's forms.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Token: token})
	b.admit(t, "s-1", "m-1", "hello")
	b.quarantineClaim(t, "s-q")

	// Not the database's fault: a 400 naming the parameter, never a 503
	// ("reload to try again") with an error line in the log.
	t.Run("TextThatIsNotUTF8IsABadRequest", func(t *testing.T) {
		for _, path := range []string{"/session?id=%FF", "/session?id=s%00", "/timeline.svg?id=%FF", "/sessions?q=%FF",
			"/sessions?after=2026-01-01T00:00:00Z%7C%FF", "/recovery?decision=%00"} {
			code, body := b.get(t, path, token)
			require.Equal(t, http.StatusBadRequest, code, "%s: %s", path, body)
			require.NotContains(t, body, "reading the database failed", path)
		}
		require.NotContains(t, b.log.String(), `"level":"ERROR"`, "a bad request is not a database failure")

		_, body := b.get(t, "/quarantine", token)
		csrf := csrfRe.FindStringSubmatch(body)
		require.NotNil(t, csrf)
		// Repaired, so that only the operator's name stands in the way.
		_, err := b.pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id = 's-q'`)
		require.NoError(t, err)
		form := url.Values{"kind": {"claim"}, "id": {"s-q"}, "operator": {"alice\xff"}, "csrf": {csrf[1]}}
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/quarantine/release", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a form field that is not UTF-8")
		_, body = b.get(t, "/quarantine", token)
		require.Contains(t, body, `<td>claim</td><td>s-q</td>`, "nothing released")
	})

	// The login form is served to anyone: its body must be bounded, or
	// anyone may make the console read (and spool to disk) gigabytes.
	t.Run("HugeBodyRefused", func(t *testing.T) {
		var body strings.Builder
		mw := multipart.NewWriter(&body)
		fw, err := mw.CreateFormFile("upload", "big")
		require.NoError(t, err)
		_, err = io.WriteString(fw, strings.Repeat("x", 2<<20))
		require.NoError(t, err)
		require.NoError(t, mw.WriteField("token", "wrong-token-0123456789"))
		require.NoError(t, mw.Close())
		req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/login", strings.NewReader(body.String()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)

		big := url.Values{"token": {strings.Repeat("y", 2<<20)}}
		resp, err = noRedirect.PostForm(b.srv.URL+"/login", big)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	})
}
