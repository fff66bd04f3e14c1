package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/tools"
	promptmcp "github.com/promptline/promptline/tools/mcp"
)

// testServer is a Go MCP server over streamable HTTP that records the
// _meta of every call.
type testServer struct {
	srv     *httptest.Server
	started chan struct{} // a call of "hang" arrived
	release chan struct{} // closed: "hang" answers

	mu    sync.Mutex
	metas []map[string]any
	args  []string
}

var objectSchema = map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []any{"id"}}

func newTestServer(t *testing.T, extra ...*mcp.Tool) *testServer {
	t.Helper()
	ts := &testServer{started: make(chan struct{}, 16), release: make(chan struct{})}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	handler := func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ts.mu.Lock()
		ts.metas = append(ts.metas, req.Params.Meta)
		ts.args = append(ts.args, string(req.Params.Arguments))
		ts.mu.Unlock()
		switch req.Params.Name {
		case "hang":
			ts.started <- struct{}{}
			select {
			case <-ts.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case "refuse":
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no such order"}}}, nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done " + req.Params.Name}}}, nil
	}
	for _, tl := range append([]*mcp.Tool{
		{Name: "lookup", Description: "Looks an order up.", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		{Name: "charge", Description: "Charges an order.", InputSchema: objectSchema},
		{Name: "hang", InputSchema: objectSchema},
		{Name: "refuse", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
	}, extra...) {
		s.AddTool(tl, handler)
	}
	ts.srv = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(func() {
		select {
		case <-ts.release:
		default:
			close(ts.release)
		}
		ts.srv.Close()
		closeSessions(s)
	})
	return ts
}

// closeSessions ends the server's sessions that no client closed (the
// client of a test that broke its connection cannot).
func closeSessions(s *mcp.Server) {
	for ss := range s.Sessions() {
		_ = ss.Close()
	}
}

func connect(t *testing.T, cfg *promptmcp.Config) (*promptmcp.Source, *tools.Registry) {
	t.Helper()
	src, err := promptmcp.Connect(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(src.Close)
	reg := tools.NewRegistry()
	require.NoError(t, src.Register(reg))
	return src, reg
}

func classes(reg *tools.Registry) map[string]tools.Class {
	out := map[string]tools.Class{}
	for _, s := range reg.Specs() {
		out[s.Name] = s.Class
	}
	return out
}

func run(t *testing.T, reg *tools.Registry, name, input string, key string, token int64) (tools.Result, error) {
	t.Helper()
	tool, ok := reg.Lookup(name)
	require.True(t, ok, name)
	require.NoError(t, reg.Validate(name, json.RawMessage(input)))
	return tool.Run(t.Context(), tools.Call{ID: "c1", Name: name, Input: json.RawMessage(input), SessionID: "s1", IdempotencyKey: key, FencingToken: token})
}

// TestHTTPServerMeta: the tools of a streamable HTTP server appear as
// SERVER__TOOL with the server's schema and their annotations' class, and
// every call carries the idempotency key and the fencing token in _meta.
func TestHTTPServerMeta(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}})
	require.Equal(t, map[string]tools.Class{
		"orders__lookup": tools.Idempotent, "orders__charge": tools.SideEffecting,
		"orders__hang": tools.SideEffecting, "orders__refuse": tools.Idempotent,
	}, classes(reg))
	for _, s := range reg.Specs() {
		if s.Name == "orders__charge" {
			require.JSONEq(t, `{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}`, string(s.InputSchema))
			require.Equal(t, "Charges an order.", s.Description)
		}
	}
	require.Error(t, reg.Validate("orders__charge", json.RawMessage(`{"id": 7}`)), "the server's schema is enforced")

	res, err := run(t, reg, "orders__charge", `{"id":"o-1"}`, "att-1/call-0", 42)
	require.NoError(t, err)
	require.Equal(t, tools.Result{Output: "done charge"}, res)
	res, err = run(t, reg, "orders__refuse", `{"id":"o-2"}`, "att-1/call-1", 43)
	require.NoError(t, err)
	require.Equal(t, tools.Result{Output: "no such order", IsError: true}, res)

	ts.mu.Lock()
	defer ts.mu.Unlock()
	require.Len(t, ts.metas, 2)
	require.Equal(t, "att-1/call-0", ts.metas[0][promptmcp.MetaIdempotencyKey])
	require.EqualValues(t, 42, ts.metas[0][promptmcp.MetaFencingToken])
	require.Equal(t, "att-1/call-1", ts.metas[1][promptmcp.MetaIdempotencyKey])
	require.EqualValues(t, 43, ts.metas[1][promptmcp.MetaFencingToken])
	require.JSONEq(t, `{"id":"o-1"}`, ts.args[0])
}

// TestHTTPServerDown: a server that is gone when a call is made gives an
// error that wraps tools.ErrNotRun (recorded failed, the model sees it).
func TestHTTPServerDown(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	noKeepAlive(ts)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}})
	ts.srv.Close()
	_, err := run(t, reg, "orders__charge", `{"id":"o-1"}`, "k", 1)
	require.ErrorIs(t, err, tools.ErrNotRun)
	require.Contains(t, err.Error(), "MCP server orders is down")
}

// noKeepAlive makes ts close each connection after its answer, so that a
// call made after ts.srv.Close opens a new connection and is refused.
// With keep-alive, the call can be written on an idle connection in the
// moment before the client reads the server's close; the reset that
// follows is, rightly, an unknown outcome (the client cannot tell it from
// a server that read the call and died), and a test that expects "not
// run" would fail now and then.
func noKeepAlive(ts *testServer) { ts.srv.Config.SetKeepAlivesEnabled(false) }

// TestHTTPRequestsCannotBeResent: net/http resends a written request by
// rewinding its body (GetBody), which the SDK's bytes.Reader allows:
// HTTP/2 does so after a stream reset with PROTOCOL_ERROR, for any
// method, and a side-effecting call the server had read would run again.
// Every request reaches the transport with no way to rewind it.
func TestHTTPRequestsCannotBeResent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	var mu sync.Mutex
	var posts, rewindable int
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		if r.Method == http.MethodPost {
			posts++
			if r.GetBody != nil {
				rewindable++
			}
		}
		mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})}
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}, HTTPClient: client})
	res, err := run(t, reg, "orders__charge", `{"id":"o-1"}`, "k1", 1)
	require.NoError(t, err)
	require.Equal(t, tools.Result{Output: "done charge"}, res)
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, posts, 2, "initialize, then the call")
	require.Zero(t, rewindable)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestHTTPServerCrashMidCall: the connection breaks while a call is out:
// the error does not wrap tools.ErrNotRun, so the outcome is unknown.
func TestHTTPServerCrashMidCall(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}})
	errc := make(chan error, 1)
	go func() {
		_, err := run(t, reg, "orders__hang", `{"id":"o-1"}`, "k", 1)
		errc <- err
	}()
	<-ts.started
	ts.srv.CloseClientConnections()
	err := <-errc
	require.Error(t, err)
	require.NotErrorIs(t, err, tools.ErrNotRun)
}

// TestConnectRefuses: what stops the consumer at start names the server
// and the tool.
func TestConnectRefuses(t *testing.T) {
	t.Parallel()
	t.Run("NoTools", func(t *testing.T) {
		t.Parallel()
		s := mcp.NewServer(&mcp.Implementation{Name: "empty", Version: "1"}, &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
		srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
		t.Cleanup(func() { srv.Close(); closeSessions(s) })
		_, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "empty", URL: srv.URL}}})
		require.ErrorContains(t, err, "MCP server empty: lists no tools")
	})
	t.Run("InvalidSchema", func(t *testing.T) {
		t.Parallel()
		ts := newTestServer(t, &mcp.Tool{Name: "broken", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "nope"}}}})
		src, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}})
		require.NoError(t, err)
		t.Cleanup(src.Close)
		err = src.Register(tools.NewRegistry())
		require.ErrorContains(t, err, `MCP server orders: tool "broken"`)
		require.ErrorContains(t, err, "input schema")
	})
	t.Run("UnusableName", func(t *testing.T) {
		t.Parallel()
		ts := newTestServer(t, &mcp.Tool{Name: "a.b", InputSchema: objectSchema})
		src, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}})
		require.NoError(t, err)
		t.Cleanup(src.Close)
		require.ErrorContains(t, src.Register(tools.NewRegistry()), `MCP server orders: tool "a.b"`)
	})
	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		_, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "gone", Command: []string{filepath.Join(t.TempDir(), "no-such-server")}}}})
		require.ErrorContains(t, err, "MCP server gone")
	})
	t.Run("Twice", func(t *testing.T) {
		t.Parallel()
		ts := newTestServer(t)
		sc := promptmcp.ServerConfig{Name: "orders", URL: ts.srv.URL}
		_, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: []promptmcp.ServerConfig{sc, sc}})
		require.ErrorContains(t, err, "MCP server orders: configured twice")
	})
}

// TestOverrides: an override makes a tool stricter at will, looser only
// with "!", and must name a tool that exists.
func TestOverrides(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t)
	servers := []promptmcp.ServerConfig{{Name: "orders", URL: ts.srv.URL}}
	_, reg := connect(t, &promptmcp.Config{Servers: servers, Overrides: map[string]promptmcp.Override{
		"orders__lookup": {Class: tools.SideEffecting},
		"orders__charge": {Class: tools.Idempotent, Force: true},
	}})
	c := classes(reg)
	require.Equal(t, tools.SideEffecting, c["orders__lookup"])
	require.Equal(t, tools.Idempotent, c["orders__charge"])

	_, err := promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: servers, Overrides: map[string]promptmcp.Override{
		"orders__charge": {Class: tools.Idempotent},
	}})
	require.ErrorContains(t, err, "orders__charge=idempotent!")
	_, err = promptmcp.Connect(t.Context(), &promptmcp.Config{Servers: servers, Overrides: map[string]promptmcp.Override{
		"orders__nothing": {Class: tools.SideEffecting},
	}})
	require.ErrorContains(t, err, "--tool-class orders__nothing: no MCP server lists this tool")
}

// filesystemServer returns the command of @modelcontextprotocol/server-filesystem
// (testdata/server-filesystem, installed by npm ci) serving dir.
func filesystemServer(t *testing.T, dir string) []string {
	t.Helper()
	testkit.SkipInShortTier(t, "Node.js and @modelcontextprotocol/server-filesystem")
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is required (the Makefile's test target installs the server)")
	script, err := filepath.Abs(filepath.Join("testdata", "server-filesystem", "node_modules", "@modelcontextprotocol", "server-filesystem", "dist", "index.js"))
	require.NoError(t, err)
	_, err = os.Stat(script)
	require.NoError(t, err, "run npm ci in tools/mcp/testdata/server-filesystem (make test does)")
	return []string{node, script, dir}
}

// TestFilesystemServer: the third-party filesystem server over stdio, in a
// sandbox directory: its read tools are idempotent, write_file is
// side-effecting, and calls work.
func TestFilesystemServer(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "fs", Command: filesystemServer(t, dir)}}})
	c := classes(reg)
	require.Equal(t, tools.Idempotent, c["fs__read_text_file"])
	require.Equal(t, tools.Idempotent, c["fs__list_directory"])
	require.Equal(t, tools.SideEffecting, c["fs__write_file"])

	file := filepath.Join(dir, "a.txt")
	in, _ := json.Marshal(map[string]string{"path": file, "content": "hello"})
	res, err := run(t, reg, "fs__write_file", string(in), "k1", 1)
	require.NoError(t, err)
	require.False(t, res.IsError, res.Output)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))

	in, _ = json.Marshal(map[string]string{"path": file})
	res, err = run(t, reg, "fs__read_text_file", string(in), "k2", 1)
	require.NoError(t, err)
	require.Equal(t, tools.Result{Output: "hello"}, res)

	// Outside the sandbox: the server refuses, cleanly.
	in, _ = json.Marshal(map[string]string{"path": "/etc/hostname"})
	res, err = run(t, reg, "fs__read_text_file", string(in), "k3", 1)
	require.NoError(t, err)
	require.True(t, res.IsError, res.Output)
	require.False(t, errors.Is(err, tools.ErrNotRun))
}

// TestHTTPServerBackAfterRestart: a server that was down answers the
// next call once it is back (a restarted server knows no session): no
// failure of a server stops its tools for good.
func TestHTTPServerBackAfterRestart(t *testing.T) {
	t.Parallel()
	first := newTestServer(t)
	noKeepAlive(first)
	addr := first.srv.Listener.Addr().String()
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "orders", URL: first.srv.URL}}})
	first.srv.Close()
	_, err := run(t, reg, "orders__charge", `{"id":"o-1"}`, "k1", 1)
	require.ErrorIs(t, err, tools.ErrNotRun)

	second := newTestServer(t)
	second.srv.Close() // on another port; serve its handler on the first's
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	restarted := httptest.NewUnstartedServer(second.srv.Config.Handler)
	restarted.Listener = l
	restarted.Start()
	t.Cleanup(restarted.Close)

	res, err := run(t, reg, "orders__charge", `{"id":"o-2"}`, "k2", 1)
	require.NoError(t, err)
	require.Equal(t, tools.Result{Output: "done charge"}, res)
}

// TestStdioServerCrashMidCall: a stdio server that dies while a call is
// out leaves the call's outcome unknown (an error that does not wrap
// tools.ErrNotRun); the next call starts the server again.
func TestStdioServerCrashMidCall(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "local", Command: []string{self, stdioServerArg}}}})
	require.Equal(t, map[string]tools.Class{"local__echo": tools.Idempotent, "local__crash": tools.SideEffecting, "local__pgrp": tools.Idempotent}, classes(reg))

	_, err = run(t, reg, "local__crash", `{}`, "k1", 1)
	require.Error(t, err)
	require.NotErrorIs(t, err, tools.ErrNotRun, "the server died with the call out: unknown")

	res, err := run(t, reg, "local__echo", `{}`, "k2", 1)
	require.NoError(t, err, "the next call starts the server again")
	require.Equal(t, tools.Result{Output: "echo"}, res)
}

// TestStdioServerHasItsOwnProcessGroup: a stdio server is the leader of
// a process group of its own. In the consumer's, a terminal's Ctrl-C (or
// a service manager's signal to the whole group) killed it at once, while
// the consumer's first SIGINT is the graceful stop: a call it was running
// ended unknown, where the grace would have let it finish. The consumer
// closes its servers after the executor stopped.
func TestStdioServerHasItsOwnProcessGroup(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	_, reg := connect(t, &promptmcp.Config{Servers: []promptmcp.ServerConfig{{Name: "local", Command: []string{self, stdioServerArg}}}})
	res, err := run(t, reg, "local__pgrp", `{}`, "k1", 1)
	require.NoError(t, err)
	var pid, pgrp int
	_, err = fmt.Sscanf(res.Output, "%d %d", &pid, &pgrp)
	require.NoError(t, err, res.Output)
	require.NotEqual(t, syscall.Getpgrp(), pgrp, "the server is in the consumer's process group")
	require.Equal(t, pid, pgrp, "the server leads its group")
}
