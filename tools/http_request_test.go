package tools_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/tools"
)

// seen is a request as the server received it.
type seen struct {
	Method, Path string
	Header       http.Header
	Body         string
}

type httpBundle struct {
	srv    *httptest.Server
	client *http.Client

	mu   sync.Mutex
	reqs []seen
}

func (b *httpBundle) received() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seen(nil), b.reqs...)
}

func (b *httpBundle) hits(path string) int {
	n := 0
	for _, r := range b.received() {
		if r.Path == path {
			n++
		}
	}
	return n
}

// setupHTTP starts a server that records every request and answers by path:
// /ok 200 echoing the body, /fail 500, /big 200 with 200 KiB, /redirect 302
// to /ok, /drop reads the request and closes the connection unanswered.
func setupHTTP(t *testing.T) *httpBundle {
	t.Helper()
	b := &httpBundle{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.reqs = append(b.reqs, seen{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: string(body)})
		b.mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write(append([]byte("ok:"), body...))
		case "/fail":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("é", 100<<10)))
		case "/redirect":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/drop":
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		default:
			http.NotFound(w, r)
		}
	}))
	transport := &http.Transport{}
	b.client = &http.Client{Transport: transport}
	t.Cleanup(transport.CloseIdleConnections) // runs after srv.Close
	t.Cleanup(b.srv.Close)
	return b
}

func (b *httpBundle) endpoint(name, path string, class tools.Class) tools.Endpoint {
	return tools.Endpoint{Name: name, URL: b.srv.URL + path, Method: http.MethodPost, Class: class}
}

func newHTTPTool(t *testing.T, client *http.Client, eps ...tools.Endpoint) tools.Tool {
	t.Helper()
	tool, err := tools.NewHTTPRequest(client, eps)
	require.NoError(t, err)
	return tool
}

func httpCall(endpoint, body string) tools.Call {
	in := `{"endpoint": "` + endpoint + `"`
	if body != "" {
		in += `, "body": ` + body
	}
	return tools.Call{ID: "call-1", Name: "http_request", Input: json.RawMessage(in + "}"),
		SessionID: "s1", IdempotencyKey: "idem-123", FencingToken: 42}
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SendsKeyAndFencingToken", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		ep := b.endpoint("create", "/ok", tools.SideEffecting)
		ep.Method = http.MethodPut
		ep.Headers = map[string]string{"Authorization": "Bearer s3cret"}
		tool := newHTTPTool(t, b.client, ep)

		res, err := tool.Run(ctx, httpCall("create", `{"a": [1, 2]}`))
		require.NoError(t, err)
		require.Equal(t, tools.Result{Output: `ok:{"a": [1, 2]}`}, res)

		reqs := b.received()
		require.Len(t, reqs, 1)
		got := reqs[0]
		require.Equal(t, http.MethodPut, got.Method)
		require.Equal(t, "idem-123", got.Header.Get("Idempotency-Key"))
		require.Equal(t, "42", got.Header.Get("X-Fencing-Token"))
		require.Equal(t, "Bearer s3cret", got.Header.Get("Authorization"))
		require.Equal(t, "application/json", got.Header.Get("Content-Type"))
		require.JSONEq(t, `{"a": [1, 2]}`, got.Body)
	})

	t.Run("NoBody", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client,
			b.endpoint("side", "/ok", tools.SideEffecting), b.endpoint("idem", "/ok", tools.Idempotent))
		for _, call := range []tools.Call{httpCall("side", ""), httpCall("idem", ""), httpCall("side", "null")} {
			res, err := tool.Run(ctx, call)
			require.NoError(t, err)
			require.Equal(t, tools.Result{Output: "ok:"}, res)
		}
		for _, r := range b.received() {
			require.Empty(t, r.Body)
			require.Empty(t, r.Header.Get("Content-Type"))
			require.Equal(t, "42", r.Header.Get("X-Fencing-Token"))
		}
	})

	t.Run("OnlyConfiguredEndpoints", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("create", "/ok", tools.SideEffecting), b.endpoint("read", "/ok", tools.Idempotent))
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tool))

		require.NoError(t, reg.Validate("http_request", json.RawMessage(`{"endpoint": "read"}`)))
		require.NoError(t, reg.Validate("http_request", json.RawMessage(`{"endpoint": "create", "body": {"x": [null, true]}}`)))
		for _, in := range []string{
			`{"endpoint": "delete"}`,
			`{"endpoint": "` + b.srv.URL + `/ok"}`,
			`{"endpoint": "read", "url": "http://evil.example/"}`,
			`{"body": {}}`,
			`{"endpoint": 1}`,
		} {
			var ie *tools.InputError
			require.ErrorAs(t, reg.Validate("http_request", json.RawMessage(in)), &ie, in)
			require.Equal(t, "http_request", ie.Tool)
		}

		// Run refuses too, for a caller that did not validate.
		res, err := tool.Run(ctx, httpCall("delete", ""))
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Contains(t, res.Output, "unknown endpoint")
		require.Empty(t, b.received())

		var schema struct {
			Properties struct {
				Endpoint struct {
					Enum []string `json:"enum"`
				} `json:"endpoint"`
			} `json:"properties"`
		}
		require.NoError(t, json.Unmarshal(tool.Spec().InputSchema, &schema))
		require.Equal(t, []string{"create", "read"}, schema.Properties.Endpoint.Enum)
	})

	t.Run("ClassPerEndpoint", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client,
			b.endpoint("read", "/ok", tools.Idempotent),
			b.endpoint("create", "/ok", tools.SideEffecting),
			tools.Endpoint{Name: "defaulted", URL: b.srv.URL + "/ok"})
		require.Equal(t, "http_request", tool.Spec().Name)
		require.Equal(t, tools.SideEffecting, tool.Spec().Class)

		resolver, ok := tool.(tools.ClassResolver)
		require.True(t, ok)
		for in, want := range map[string]tools.Class{
			`{"endpoint": "read"}`:      tools.Idempotent,
			`{"endpoint": "create"}`:    tools.SideEffecting,
			`{"endpoint": "defaulted"}`: tools.SideEffecting,
			`{"endpoint": "missing"}`:   tools.SideEffecting,
			`{"endpoint": 7}`:           tools.SideEffecting,
			`not json`:                  tools.SideEffecting,
			``:                          tools.SideEffecting,
		} {
			require.Equal(t, want, resolver.ClassOf(json.RawMessage(in)), in)
			require.Equal(t, want, tools.ResolveClass(tool, json.RawMessage(in)), in)
		}
	})

	t.Run("Non2xxIsError", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("fail", "/fail", tools.SideEffecting), b.endpoint("missing", "/missing", tools.Idempotent))
		res, err := tool.Run(ctx, httpCall("fail", `{}`))
		require.NoError(t, err)
		require.Equal(t, tools.Result{IsError: true, Output: "HTTP 500: boom\n"}, res)
		res, err = tool.Run(ctx, httpCall("missing", ``))
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.True(t, strings.HasPrefix(res.Output, "HTTP 404: "), res.Output)
	})

	t.Run("RedirectNotFollowed", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("moved", "/redirect", tools.Idempotent))
		res, err := tool.Run(ctx, httpCall("moved", ``))
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.True(t, strings.HasPrefix(res.Output, "HTTP 302: "), res.Output)
		require.Zero(t, b.hits("/ok"))
	})

	t.Run("BodyBounded", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("big", "/big", tools.Idempotent))
		res, err := tool.Run(ctx, httpCall("big", ``))
		require.NoError(t, err)
		require.False(t, res.IsError)
		require.LessOrEqual(t, len(res.Output), 64<<10)
		require.Greater(t, len(res.Output), 63<<10)
		require.True(t, strings.HasSuffix(res.Output, "…[truncated]"))
		require.True(t, strings.HasPrefix(res.Output, "éé"))
		require.NotContains(t, res.Output, "\uFFFD") // cut on a rune boundary
	})

	t.Run("ConnectionRefusedNotRun", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		transport := &http.Transport{}
		t.Cleanup(transport.CloseIdleConnections)
		tool := newHTTPTool(t, &http.Client{Transport: transport},
			tools.Endpoint{Name: "gone", URL: "http://" + addr + "/x", Class: tools.SideEffecting})
		_, err = tool.Run(ctx, httpCall("gone", `{}`))
		require.Error(t, err)
		require.ErrorIs(t, err, tools.ErrNotRun)
		require.ErrorContains(t, err, "connection refused")
	})

	t.Run("LostAfterSendIsUnknown", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("drop", "/drop", tools.SideEffecting))
		_, err := tool.Run(ctx, httpCall("drop", `{}`))
		require.Error(t, err)
		require.NotErrorIs(t, err, tools.ErrNotRun)
		require.Equal(t, 1, b.hits("/drop"))
	})

	// net/http re-sends on its own a request that carries an
	// Idempotency-Key when a reused connection fails. That is fine for an
	// idempotent endpoint (same key) and must not happen for a
	// side-effecting one (P4).
	t.Run("TransportNeverResendsSideEffecting", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			class tools.Class
			body  string
			sends int
		}{
			{tools.SideEffecting, `{"n": 1}`, 1},
			{tools.SideEffecting, ``, 1},
			{tools.Idempotent, `{"n": 1}`, 2},
			{tools.Idempotent, ``, 2},
		} {
			b := setupHTTP(t)
			tool := newHTTPTool(t, b.client, b.endpoint("warm", "/ok", tc.class), b.endpoint("drop", "/drop", tc.class))
			// Leave a kept-alive connection in the pool, so the next
			// request goes out on a reused one.
			res, err := tool.Run(ctx, httpCall("warm", ``))
			require.NoError(t, err)
			require.False(t, res.IsError)

			_, err = tool.Run(ctx, httpCall("drop", tc.body))
			require.Error(t, err)
			require.Equal(t, tc.sends, b.hits("/drop"), "class %s, body %q", tc.class, tc.body)
		}
	})

	t.Run("CanceledBeforeSendNotRun", func(t *testing.T) {
		t.Parallel()
		b := setupHTTP(t)
		tool := newHTTPTool(t, b.client, b.endpoint("ok", "/ok", tools.SideEffecting))
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := tool.Run(cctx, httpCall("ok", `{}`))
		require.ErrorIs(t, err, tools.ErrNotRun)
		require.Empty(t, b.received())
	})
}

func TestNewHTTPRequestConfig(t *testing.T) {
	t.Parallel()

	ok := tools.Endpoint{Name: "ok", URL: "http://127.0.0.1:1/x"}
	_, err := tools.NewHTTPRequest(nil, []tools.Endpoint{ok})
	require.NoError(t, err, "nil client takes the default")

	for _, tc := range []struct {
		eps     []tools.Endpoint
		problem string
	}{
		{nil, "no endpoint"},
		{[]tools.Endpoint{ok, ok}, "configured twice"},
		{[]tools.Endpoint{{Name: "", URL: ok.URL}}, "name must match"},
		{[]tools.Endpoint{{Name: "a b", URL: ok.URL}}, "name must match"},
		{[]tools.Endpoint{{Name: "rel", URL: "/relative"}}, "absolute http"},
		{[]tools.Endpoint{{Name: "ftp", URL: "ftp://host/x"}}, "absolute http"},
		{[]tools.Endpoint{{Name: "bad", URL: "http://[::1"}}, "URL"},
		{[]tools.Endpoint{{Name: "m", URL: ok.URL, Method: "GE T"}}, "bad method"},
		{[]tools.Endpoint{{Name: "c", URL: ok.URL, Class: "perhaps"}}, "unknown class"},
		{[]tools.Endpoint{{Name: "h", URL: ok.URL, Headers: map[string]string{"idempotency-key": "x"}}}, "set by http_request"},
		{[]tools.Endpoint{{Name: "h", URL: ok.URL, Headers: map[string]string{"X-Fencing-Token": "1"}}}, "set by http_request"},
		{[]tools.Endpoint{{Name: "h", URL: ok.URL, Headers: map[string]string{"X-Ok": "a\r\nX-Injected: 1"}}}, "bad header"},
		{[]tools.Endpoint{{Name: "h", URL: ok.URL, Headers: map[string]string{"Bad Name": "v"}}}, "bad header"},
	} {
		_, err := tools.NewHTTPRequest(nil, tc.eps)
		require.ErrorContains(t, err, tc.problem)
	}
}

// TestHTTPRequestErrorsHideURLSecrets: the error of a failed call goes to
// the model, the transcript and the session-events topic, and
// NewHTTPRequest's to stderr: neither carries the URL's password or its
// query secrets.
func TestHTTPRequestErrorsHideURLSecrets(t *testing.T) {
	t.Parallel()
	secrets := []string{"hunter2", "t0ken", "k3y"}

	t.Run("CallError", func(t *testing.T) {
		t.Parallel()
		// Nothing listens on port 1: the connection is refused.
		tool, err := tools.NewHTTPRequest(nil, []tools.Endpoint{{Name: "hook", URL: "http://u:hunter2@127.0.0.1:1/x?token=t0ken&api_key=k3y"}})
		require.NoError(t, err)
		_, err = tool.Run(context.Background(), tools.Call{Input: json.RawMessage(`{"endpoint":"hook"}`)})
		require.ErrorIs(t, err, tools.ErrNotRun)
		for _, s := range secrets {
			require.NotContains(t, err.Error(), s)
		}
		require.Contains(t, err.Error(), "127.0.0.1:1/x?token=****")
	})

	t.Run("ConfigErrors", func(t *testing.T) {
		t.Parallel()
		for _, ep := range []tools.Endpoint{
			{Name: "x", URL: "ftp://u:hunter2@h/x?token=t0ken"},
			{Name: "x", URL: "https://u:hu/nter2@h/x?token=t0ken"},
			{Name: "x", URL: "https://h/x?api_key=k3y", Class: "sometimes"},
			{Name: "x", URL: "http://u:hunter2@h/x\x7f?token=t0ken"},
		} {
			_, err := tools.NewHTTPRequest(nil, []tools.Endpoint{ep})
			require.Error(t, err, ep.URL)
			for _, s := range append(secrets, "nter2") {
				require.NotContains(t, err.Error(), s, ep.URL)
			}
		}
	})
}
