package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/promptline/promptline/tools"
)

// The _meta fields of every tools/call request.
const (
	// MetaIdempotencyKey is the call's idempotency key (a string): the same
	// on every run of the same call.
	MetaIdempotencyKey = "promptline/idempotency-key"
	// MetaFencingToken is the fencing token of the execution's claim (a
	// number that only grows).
	MetaFencingToken = "promptline/fencing-token"
)

const (
	connectTimeoutDefault = 30 * time.Second
	// maxOutput bounds a call's output returned to the model.
	maxOutput = 64 << 10
)

// Config configures Connect.
type Config struct {
	// Servers are the servers to mount; their names must be distinct.
	Servers []ServerConfig
	// Overrides are the operators' classes, by tool name (SERVER__TOOL).
	// An override naming no tool of the servers is an error. Defaults to none.
	Overrides map[string]Override
	// ConnectTimeout bounds connecting to one server and listing its tools,
	// at start and when a call reconnects. Defaults to 30s.
	ConnectTimeout time.Duration
	// HTTPClient sends the requests of streamable HTTP servers. Defaults to
	// a client with no timeout (the tool deadline bounds a call).
	HTTPClient *http.Client
	// Stderr receives what stdio servers write on their stderr. Defaults to
	// discarding it.
	Stderr io.Writer
	// Logger logs reconnections. Defaults to discarding.
	Logger *slog.Logger
}

// Source holds the connections to the servers and their tools.
type Source struct {
	servers []*server
	tools   []tools.Tool
}

// Connect connects to every server and lists its tools. A server that
// cannot be reached, lists no tools, or has a tool whose name or class
// override cannot be used, is an error naming the server and the tool.
// (Each tool's schema is compiled when it is registered: register them all
// before starting.) On error every connection made is closed.
func Connect(ctx context.Context, cfg *Config) (*Source, error) {
	s := &Source{}
	seen := map[string]bool{}
	used := map[string]bool{}
	for _, sc := range cfg.Servers {
		if err := sc.Validate(); err != nil {
			s.Close()
			return nil, fmt.Errorf("MCP server: %w", err)
		}
		if seen[sc.Name] {
			s.Close()
			return nil, fmt.Errorf("MCP server %s: configured twice", sc.Name)
		}
		seen[sc.Name] = true
		srv := newServer(sc, cfg)
		s.servers = append(s.servers, srv)
		list, err := srv.start(ctx)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("MCP server %s: %w", sc.Name, err)
		}
		if len(list) == 0 {
			s.Close()
			return nil, fmt.Errorf("MCP server %s: lists no tools", sc.Name)
		}
		for _, mt := range list {
			t, err := newTool(srv, mt, cfg.Overrides)
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("MCP server %s: tool %q: %w", sc.Name, mt.Name, err)
			}
			used[t.spec.Name] = true
			s.tools = append(s.tools, t)
		}
	}
	for name := range cfg.Overrides {
		if !used[name] {
			s.Close()
			return nil, fmt.Errorf("--tool-class %s: no MCP server lists this tool", name)
		}
	}
	return s, nil
}

// Tools returns the servers' tools.
func (s *Source) Tools() []tools.Tool { return s.tools }

// Register registers every tool in reg. An error (a schema that does not
// compile, a name that is not usable or already taken) names the server
// and the tool.
func (s *Source) Register(reg *tools.Registry) error {
	for _, t := range s.tools {
		mt := t.(*tool)
		if err := reg.Register(t); err != nil {
			return fmt.Errorf("MCP server %s: tool %q: %w", mt.srv.cfg.Name, mt.remote, err)
		}
	}
	return nil
}

// Close ends every connection (a stdio server's stdin is closed, then it is
// terminated). It may be called twice.
func (s *Source) Close() {
	for _, srv := range s.servers {
		srv.close()
	}
}

// server is one server's connection, reconnected when it was lost.
type server struct {
	cfg    ServerConfig
	client *mcp.Client
	opts   *Config
	log    *slog.Logger

	mu     sync.Mutex
	cs     *mcp.ClientSession
	lost   chan struct{} // closed when cs ended
	closed bool
}

func newServer(sc ServerConfig, cfg *Config) *server {
	return &server{
		cfg:    sc,
		client: mcp.NewClient(&mcp.Implementation{Name: "promptline", Version: "1"}, nil),
		opts:   cfg,
		log:    cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
	}
}

// stdioEnv are the variables a stdio server inherits: not the consumer's
// settings, which hold the database URL and secrets.
var stdioEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TZ"}

func (s *server) transport() mcp.Transport {
	if s.cfg.URL != "" {
		return &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: noResendClient(cmp.Or(s.opts.HTTPClient, http.DefaultClient)), MaxRetries: -1, DisableStandaloneSSE: true}
	}
	cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
	cmd.Env = []string{}
	for _, k := range stdioEnv {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Stderr = cmp.Or[io.Writer](s.opts.Stderr, io.Discard)
	// A process group of its own: in the consumer's, the signal a
	// terminal's Ctrl-C (or a service manager) sends the whole group would
	// kill the server at once, while the consumer takes its first SIGINT as
	// a graceful stop and lets running calls finish within the grace; a
	// call out on a killed server ends unknown. The consumer closes its
	// servers after its executor stopped (Source.Close), and a server
	// whose consumer died reads the end of its stdin.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
}

// start connects and lists the tools.
func (s *server) start(ctx context.Context) ([]*mcp.Tool, error) {
	cs, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(s.opts.ConnectTimeout, connectTimeoutDefault))
	defer cancel()
	var out []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("listing tools: %w", err)
		}
		out = append(out, t)
	}
	return out, nil
}

// session returns the live session, connecting when there is none (at
// start, or after the server's process or connection ended). An error
// means that no request was sent.
func (s *server) session(ctx context.Context) (*mcp.ClientSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("closed")
	}
	if s.cs != nil {
		select {
		case <-s.lost:
			s.log.WarnContext(ctx, "MCP server connection lost; reconnecting", slog.String("server", s.cfg.Name))
			_ = s.cs.Close() // reaps a stdio server's process
			s.cs = nil
		default:
			return s.cs, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(s.opts.ConnectTimeout, connectTimeoutDefault))
	defer cancel()
	cs, err := s.client.Connect(ctx, s.transport(), nil)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	lost := make(chan struct{})
	go func() { _ = cs.Wait(); close(lost) }()
	s.cs, s.lost = cs, lost
	return cs, nil
}

// drop ends cs if it is still the live session: the next call connects
// again.
func (s *server) drop(cs *mcp.ClientSession) {
	s.mu.Lock()
	live := s.cs == cs
	if live {
		s.cs = nil
	}
	s.mu.Unlock()
	if live {
		s.log.Warn("MCP server connection failed; the next call reconnects", slog.String("server", s.cfg.Name))
		_ = cs.Close()
	}
}

func (s *server) close() {
	s.mu.Lock()
	cs := s.cs
	s.cs, s.closed = nil, true
	s.mu.Unlock()
	if cs != nil {
		_ = cs.Close()
	}
}

// tool is one tool of a server.
type tool struct {
	srv    *server
	remote string // the tool's name on its server
	spec   tools.Spec
}

var _ tools.Tool = (*tool)(nil)

func newTool(srv *server, mt *mcp.Tool, overrides map[string]Override) (*tool, error) {
	schema, err := json.Marshal(mt.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	name := ToolName(srv.cfg.Name, mt.Name)
	class := ClassOf(mt.Annotations)
	if o, ok := overrides[name]; ok {
		if class, err = o.apply(name, class); err != nil {
			return nil, err
		}
	}
	desc := mt.Description
	if desc == "" && mt.Annotations != nil {
		desc = mt.Annotations.Title
	}
	return &tool{srv: srv, remote: mt.Name, spec: tools.Spec{
		Name: name, Description: desc, InputSchema: schema, Class: class,
	}}, nil
}

func (t *tool) Spec() tools.Spec { return t.spec }

// Run calls the tool on its server. The server's error result
// (isError) is a failed Result; a protocol error the server answered
// with (unknown tool, invalid arguments) too. No connection, or a server
// that refused the connection: an error wrapping tools.ErrNotRun. A
// connection that broke while the call was out: a plain error, the
// outcome is unknown.
func (t *tool) Run(ctx context.Context, call tools.Call) (tools.Result, error) {
	cs, err := t.srv.session(ctx)
	if err != nil {
		return tools.Result{}, fmt.Errorf("MCP server %s is down: %w: %w", t.srv.cfg.Name, tools.ErrNotRun, err)
	}
	params := &mcp.CallToolParams{
		Meta: mcp.Meta{MetaIdempotencyKey: call.IdempotencyKey, MetaFencingToken: call.FencingToken},
		Name: t.remote, Arguments: json.RawMessage(call.Input),
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return t.callError(ctx, cs, err)
	}
	out := output(res)
	return tools.Result{Output: out, IsError: res.IsError}, nil
}

// callError sorts an error from CallTool into "not run" and "unknown".
// After an error of the connection (not an answer of the server, not the
// call's own deadline) the session is dropped, so that the next call
// connects again: a connection the SDK marked failed would otherwise fail
// every later call.
func (t *tool) callError(ctx context.Context, cs *mcp.ClientSession, err error) (tools.Result, error) {
	var wire *jsonrpcError
	if errors.As(err, &wire) && refusedCodes[wire.Code] {
		// The server answered that it did not take the call.
		return tools.Result{IsError: true, Output: bound(fmt.Sprintf("MCP server %s refused the call: %s", t.srv.cfg.Name, wire.Message))}, nil
	}
	if ctx.Err() == nil {
		t.srv.drop(cs)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		// Nothing reached the server.
		return tools.Result{}, fmt.Errorf("MCP server %s is down: %w: %w", t.srv.cfg.Name, tools.ErrNotRun, err)
	case errors.Is(err, mcp.ErrSessionMissing):
		// The server refused the request: it no longer knows the session.
		return tools.Result{}, fmt.Errorf("MCP server %s ended the session: %w: %w", t.srv.cfg.Name, tools.ErrNotRun, err)
	}
	return tools.Result{}, fmt.Errorf("MCP server %s: %w", t.srv.cfg.Name, err)
}

// output is the text the model gets: the text contents, joined; other
// contents and the structured content as JSON.
func output(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
			continue
		}
		if b, err := json.Marshal(c); err == nil {
			parts = append(parts, string(b))
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	return bound(strings.Join(parts, "\n"))
}

const truncatedMark = "…[truncated]"

func bound(s string) string {
	if len(s) <= maxOutput {
		return s
	}
	return strings.ToValidUTF8(s[:maxOutput-len(truncatedMark)], "") + truncatedMark
}

type jsonrpcError = jsonrpc.Error

// refusedCodes are the JSON-RPC errors a server answers with before a
// tool runs: the request was malformed, the tool unknown, its arguments
// invalid.
var refusedCodes = map[int64]bool{
	jsonrpc.CodeParseError: true, jsonrpc.CodeInvalidRequest: true,
	jsonrpc.CodeMethodNotFound: true, jsonrpc.CodeInvalidParams: true,
}

// noResendClient is c with a transport that cannot resend a request it
// wrote. The SDK posts each message from a bytes.Reader, for which
// net/http sets GetBody, and net/http resends a written request by
// rewinding it: HTTP/2 after a stream reset with PROTOCOL_ERROR, for any
// method. A side-effecting call the server had read would run again, and
// a connection refused on the resend would make it read as not run. A
// wrapper, because the SDK builds the requests: it clears GetBody, so
// that only what was never written is retried.
func noResendClient(c *http.Client) *http.Client {
	nc := *c
	nc.Transport = noResend{base: cmp.Or[http.RoundTripper](c.Transport, http.DefaultTransport)}
	return &nc
}

type noResend struct{ base http.RoundTripper }

func (n noResend) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.GetBody != nil {
		r = r.Clone(r.Context())
		r.GetBody = nil
	}
	return n.base.RoundTrip(r)
}
