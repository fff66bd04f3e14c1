package main

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	promptmcp "github.com/promptline/promptline/tools/mcp"
)

// Tools from MCP servers (docs/tools.md, "Tools from MCP servers") on real
// consumer processes: the third-party filesystem server over stdio, and a
// Go server over streamable HTTP that records the _meta of its calls.

// filesystemServerFlag is the --mcp-server value that runs
// @modelcontextprotocol/server-filesystem (tools/mcp/testdata, installed
// by npm ci) on dir, named fs.
func filesystemServerFlag(t *testing.T, dir string) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "tools", "mcp", "testdata", "server-filesystem",
		"node_modules", "@modelcontextprotocol", "server-filesystem", "dist", "index.js"))
	require.NoError(t, err)
	_, err = os.Stat(script)
	require.NoError(t, err, "run npm ci in tools/mcp/testdata/server-filesystem (make test does)")
	return `name=fs,command="node '` + script + `' '` + dir + `'"`
}

// sandboxDir is a temporary directory by its real path (the filesystem
// server compares resolved paths).
func sandboxDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	return dir
}

// TestCrashAfterMCPWriteFileRan kills the consumer after the filesystem
// server's write_file (side_effecting by its annotations: idempotentHint
// but destructiveHint) ran and before its result was committed. After a
// restart and a recovery pass the call is unknown and never run again: the
// file, written once before the crash and then removed by the test, does
// not come back, neither after recovery nor after a later prompt.
//
// It catches: a side-effecting MCP tool classed idempotent (recovery would
// re-run it under idempotent_tool_retry and the file would reappear), and
// any replay of an uncertain MCP call (P4).
func TestCrashAfterMCPWriteFileRan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-mcp-write"
	dir := sandboxDir(t)
	file := filepath.Join(dir, "out.txt")
	input, _ := json.Marshal(map[string]string{"path": file, "content": "once"})
	first := prompt(session, "/tool fs__write_file "+string(input))
	later := prompt(session, "later")
	server := filesystemServerFlag(t, dir)

	crashing := b.start(t, "consumer-1", faults.ToolAfterRun, "--lease", "1s", "--mcp-server", server)
	// The MCP server starts first (npx), which alone took 13 to 24 s on a
	// loaded machine under -race: crashTimeout bounds the turn, not that.
	crashing.waitLog(t, "consumer running", time.Minute)
	b.send(t, first)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls
		WHERE session_id = $1 AND tool = 'fs__write_file' AND class = 'side_effecting' AND state = 'started'`, session),
		"the call's intent was committed, its result not")
	got, err := os.ReadFile(file)
	require.NoError(t, err, "the call ran before the crash")
	require.Equal(t, "once", string(got))
	// Any file from here on is a replay.
	require.NoError(t, os.Remove(file))

	b.start(t, "consumer-2", "", append(recoveryFlags, "--mcp-server", server)...)
	failed := b.events.waitTurn(t, first.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)

	b.send(t, later)
	done := b.events.waitTurn(t, later.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, done.Type, "a later prompt of the session runs: %+v", done)
	_, err = os.Stat(file)
	require.True(t, errors.Is(err, fs.ErrNotExist), "write_file must never run again: %v", err)

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1`, session), "no second call")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'unknown'`, session))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'reconciled'`, session))
}

// TestCrashBeforeMCPReadFileRetried: killed between the intent of the
// filesystem server's read_text_file (idempotent: readOnlyHint) and its
// dispatch. Recovery runs it again, once, under the same idempotency key,
// and the turn completes with the file's text.
func TestCrashBeforeMCPReadFileRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-mcp-read"
	dir := sandboxDir(t)
	file := filepath.Join(dir, "in.txt")
	require.NoError(t, os.WriteFile(file, []byte("hello"), 0o644))
	input, _ := json.Marshal(map[string]string{"path": file})
	p := prompt(session, "/tool fs__read_text_file "+string(input))
	server := filesystemServerFlag(t, dir)

	crashing := b.start(t, "consumer-1", faults.IdempotentToolAfterIntent, "--lease", "1s", "--mcp-server", server)
	// The MCP server starts first (npx), which alone took 13 to 24 s on a
	// loaded machine under -race: crashTimeout bounds the turn, not that.
	crashing.waitLog(t, "consumer running", time.Minute)
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls
		WHERE session_id = $1 AND tool = 'fs__read_text_file' AND class = 'idempotent' AND state = 'started'`, session))

	b.start(t, "consumer-2", "", append(recoveryFlags, "--mcp-server", server)...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: fs__read_text_file: hello", turn.Text)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'succeeded'`, session), "the same call, once")
}

// metaServer is a Go MCP server over streamable HTTP that records the
// _meta of every call.
type metaServer struct {
	url   string
	srv   *httptest.Server
	mu    sync.Mutex
	metas []mcp.Meta
	names []string
}

func newMetaServer(t *testing.T) *metaServer {
	t.Helper()
	ms := &metaServer{}
	s := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	schema := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []any{"id"}}
	handler := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ms.mu.Lock()
		ms.metas, ms.names = append(ms.metas, req.Params.Meta), append(ms.names, req.Params.Name)
		ms.mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done " + req.Params.Name}}}, nil
	}
	s.AddTool(&mcp.Tool{Name: "charge", InputSchema: schema}, handler)
	s.AddTool(&mcp.Tool{Name: "lookup", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, handler)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(func() {
		srv.Close()
		for ss := range s.Sessions() {
			_ = ss.Close()
		}
	})
	ms.url, ms.srv = srv.URL, srv
	return ms
}

// TestMCPToolOverHTTP: a call of an MCP tool reaches the server once, with
// the ledger's idempotency key and the claim's fencing token in _meta; a
// --tool-permission deny, spelt SERVER.TOOL, keeps another tool's call
// from the server.
func TestMCPToolOverHTTP(t *testing.T) {
	t.Parallel()
	ms := newMetaServer(t)
	b := setup(t)
	b.start(t, "consumer", "", "--mcp-server", "name=orders,url="+ms.url, "--tool-permission", "orders.lookup=deny")
	p := prompt("s-mcp-http", `/tool orders__charge {"id": "o-1"}`)
	b.send(t, p)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, "tool results: orders__charge: done charge", turn.Text)

	denied := prompt("s-mcp-denied", `/tool orders__lookup {"id": "o-2"}`)
	b.send(t, denied)
	b.events.waitTurn(t, denied.MessageID)

	var key string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT idempotency_key FROM tool_calls
		WHERE session_id = 's-mcp-http' AND tool = 'orders__charge' AND class = 'side_effecting' AND state = 'succeeded'`).Scan(&key))
	ms.mu.Lock()
	defer ms.mu.Unlock()
	require.Equal(t, []string{"charge"}, ms.names, "one call, the denied tool never reached the server")
	require.Equal(t, key, ms.metas[0][promptmcp.MetaIdempotencyKey])
	require.EqualValues(t, 1, ms.metas[0][promptmcp.MetaFencingToken])
}

// TestMCPServerDownAtCall: a server that went away after the start gives
// a clean failure: the call is failed (never unknown, nothing was sent),
// the model sees why, and the turn completes.
func TestMCPServerDownAtCall(t *testing.T) {
	t.Parallel()
	ms := newMetaServer(t)
	b := setup(t)
	c := b.start(t, "consumer", "", "--mcp-server", "name=orders,url="+ms.url)
	c.waitLog(t, "consumer running", 60*time.Second)
	ms.srv.Close()
	p := prompt("s-mcp-down", `/tool orders__charge {"id": "o-1"}`)
	b.send(t, p)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Contains(t, turn.Text, "tool results: orders__charge: not run: MCP server orders is down")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's-mcp-down' AND state = 'failed'`))
}

// TestMCPServerRefusedAtStart: a server that lists no tools, one that does
// not start, and an override that would loosen a class stop the consumer
// at start with a message naming it.
func TestMCPServerRefusedAtStart(t *testing.T) {
	t.Parallel()
	empty := mcp.NewServer(&mcp.Implementation{Name: "empty", Version: "1"}, &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return empty }, nil))
	t.Cleanup(func() {
		srv.Close()
		for ss := range empty.Sessions() {
			_ = ss.Close()
		}
	})
	ms := newMetaServer(t)
	b := setup(t)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"NoTools":  {[]string{"--mcp-server", "name=empty,url=" + srv.URL}, "MCP server empty: lists no tools"},
		"NoServer": {[]string{"--mcp-server", "name=gone,command=" + filepath.Join(t.TempDir(), "none")}, "MCP server gone"},
		"Looser":   {[]string{"--mcp-server", "name=orders,url=" + ms.url, "--tool-class", "orders.charge=idempotent"}, "orders__charge=idempotent!"},
	} {
		p := b.start(t, "consumer-"+name, "", tc.args...)
		st := p.waitExit(t, 60*time.Second)
		require.Equal(t, 1, st.ExitCode(), name)
		require.Contains(t, p.stderr.String(), tc.want, name)
	}
}

func TestMCPServerFlag(t *testing.T) {
	t.Parallel()
	for flag, v := range map[string]string{
		"--mcp-server": "name=a_b,command=ls",
		"--tool-class": "fs.write_file=sometimes",
	} {
		_, stderr, code := runOnce(t, flag, v, "--database-url", "postgres://127.0.0.1:1/none", "--brokers", "127.0.0.1:1")
		require.Equal(t, 1, code, v)
		require.Contains(t, stderr, flag, v)
	}
}
