package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
	"github.com/promptline/promptline/tools/mcp"
)

// providerOptions are the provider and tool flags.
type providerOptions struct {
	kind          string
	url           string
	idempotent    bool
	openaiBase    string
	openaiModel   string
	openaiKeyEnv  string
	openaiKeyFile string
	openaiStream  bool
	sandboxDir    string
	httpEndpoints []string // --http-tool-endpoint values
	mcpServers    []string // --mcp-server values
	toolClasses   []string // --tool-class values
}

func (p *providerOptions) validate() error {
	switch p.kind {
	case "scripted":
	case "http":
		if p.url == "" {
			return fmt.Errorf("--provider-url: required with --provider http")
		}
		if err := (&providers.HTTPConfig{URL: p.url}).Validate(); err != nil {
			return fmt.Errorf("--provider-url: %w", err)
		}
	case "openai":
		if p.openaiModel == "" {
			return fmt.Errorf("--openai-model: required with --provider openai")
		}
		// The provider's own check of the URL (it redacts credentials in
		// what it prints); the key is checked next, so a stand-in here.
		if err := (&providers.OpenAIConfig{BaseURL: p.openaiBase, Model: p.openaiModel, APIKey: "checked below"}).Validate(); err != nil {
			return fmt.Errorf("--openai-base-url: %w", err)
		}
		if _, err := providers.LoadAPIKey(p.openaiKeyEnv, p.openaiKeyFile); err != nil {
			return fmt.Errorf("--openai-api-key-env/--openai-api-key-file: %w", err)
		}
	default:
		return fmt.Errorf("--provider: want scripted, http or openai, got %q", p.kind)
	}
	// Endpoints and MCP servers are checked now, before anything connects.
	if _, err := p.mcpConfig(); err != nil {
		return err
	}
	return p.registerHTTPTool(tools.NewRegistry())
}

// mcpConfig reads --mcp-server and --tool-class.
func (p *providerOptions) mcpConfig() (*mcp.Config, error) {
	cfg := &mcp.Config{Overrides: map[string]mcp.Override{}, Stderr: os.Stderr}
	for _, v := range p.mcpServers {
		sc, err := mcp.ParseServer(v)
		if err != nil {
			return nil, fmt.Errorf("--mcp-server %q: %w", v, err)
		}
		cfg.Servers = append(cfg.Servers, sc)
	}
	for _, v := range p.toolClasses {
		name, o, err := mcp.ParseOverride(v)
		if err != nil {
			return nil, fmt.Errorf("--tool-class: %w", err)
		}
		cfg.Overrides[name] = o
	}
	return cfg, nil
}

// registerMCPTools connects to the --mcp-server servers and registers
// their tools; the returned function closes the connections. A server
// that cannot be reached, lists no tools or has a tool that cannot be
// registered stops the start, named in the error.
func (p *providerOptions) registerMCPTools(ctx context.Context, reg *tools.Registry, log *slog.Logger) (func(), error) {
	if len(p.mcpServers) == 0 && len(p.toolClasses) == 0 {
		return func() {}, nil
	}
	cfg, err := p.mcpConfig()
	if err != nil {
		return nil, err
	}
	cfg.Logger = log
	src, err := mcp.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := src.Register(reg); err != nil {
		src.Close()
		return nil, err
	}
	for _, t := range src.Tools() {
		s := t.Spec()
		log.InfoContext(ctx, "MCP tool", slog.String("tool", s.Name), slog.String("class", string(s.Class)))
	}
	return src.Close, nil
}

// build returns the provider, its name as recorded on attempts, and the
// tools. The demo tools (echo, append_line) come with the scripted
// provider only: append_line writes files, in a sandbox directory.
func (p *providerOptions) build(ctx context.Context, log *slog.Logger) (provider.Provider, string, *tools.Registry, func(), error) {
	reg := tools.NewRegistry()
	closeMCP, err := p.registerMCPTools(ctx, reg, log)
	if err != nil {
		return nil, "", nil, nil, err
	}
	prov, name, reg, cleanup, err := p.buildProvider(reg, log)
	if err != nil {
		closeMCP()
		return nil, "", nil, nil, err
	}
	return prov, name, reg, func() { cleanup(); closeMCP() }, nil
}

func (p *providerOptions) buildProvider(reg *tools.Registry, log *slog.Logger) (provider.Provider, string, *tools.Registry, func(), error) {
	cleanup := func() {}
	switch p.kind {
	case "scripted":
		dir := p.sandboxDir
		if dir == "" {
			d, err := os.MkdirTemp("", "promptline-sandbox-")
			if err != nil {
				return nil, "", nil, nil, fmt.Errorf("--sandbox-dir: %w", err)
			}
			dir, cleanup = d, func() { os.RemoveAll(d) }
			log.Info("append_line sandbox (removed at exit; set --sandbox-dir to keep it)", slog.String("dir", dir))
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, "", nil, nil, fmt.Errorf("--sandbox-dir: %w", err)
		}
		if err := reg.Register(tools.NewEcho()); err != nil {
			return nil, "", nil, nil, err
		}
		if err := reg.Register(tools.NewAppendLine(dir)); err != nil {
			return nil, "", nil, nil, err
		}
		if err := p.registerHTTPTool(reg); err != nil {
			return nil, "", nil, nil, err
		}
		return scripted.ScriptedProvider{}, "scripted", reg, cleanup, nil
	case "http":
		cfg := &providers.HTTPConfig{URL: p.url, HonoursIdempotencyKeys: p.idempotent}
		if err := cfg.Validate(); err != nil {
			return nil, "", nil, nil, fmt.Errorf("--provider-url: %w", err)
		}
		if err := p.registerHTTPTool(reg); err != nil {
			return nil, "", nil, nil, err
		}
		return providers.NewHTTP(http.DefaultClient, cfg), "http", reg, cleanup, nil
	case "openai":
		key, err := providers.LoadAPIKey(p.openaiKeyEnv, p.openaiKeyFile)
		if err != nil {
			return nil, "", nil, nil, fmt.Errorf("--openai-api-key-env/--openai-api-key-file: %w", err)
		}
		prov, err := providers.NewOpenAI(http.DefaultClient, &providers.OpenAIConfig{
			BaseURL: p.openaiBase, Model: p.openaiModel, APIKey: key, HonoursIdempotencyKeys: p.idempotent,
			Stream: p.openaiStream,
		})
		if err != nil {
			return nil, "", nil, nil, fmt.Errorf("--provider openai: %w", err)
		}
		if err := p.registerHTTPTool(reg); err != nil {
			return nil, "", nil, nil, err
		}
		return prov, "openai", reg, cleanup, nil
	}
	return nil, "", nil, nil, fmt.Errorf("--provider: unknown %q", p.kind)
}

// permissionPolicy maps tool names to their policy; unlisted tools are allowed.
type permissionPolicy map[string]tools.Permission

func (p permissionPolicy) lookup(tool string) tools.Permission {
	if perm, ok := p[tool]; ok {
		return perm
	}
	return tools.Allow
}

func parsePermissions(flags []string) (permissionPolicy, error) {
	p := permissionPolicy{}
	for _, f := range flags {
		name, policy, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--tool-permission: want NAME=allow|deny|ask, got %q", f)
		}
		name = mcp.CanonicalName(name) // SERVER.TOOL is SERVER__TOOL
		perm, err := tools.ParsePermission(policy)
		if err != nil {
			return nil, fmt.Errorf("--tool-permission %s: %w", name, err)
		}
		p[name] = perm
	}
	return p, nil
}

// registerHTTPTool registers the http_request tool when endpoints are
// configured: the model names an endpoint, never a URL.
func (p *providerOptions) registerHTTPTool(reg *tools.Registry) error {
	if len(p.httpEndpoints) == 0 {
		return nil
	}
	var eps []tools.Endpoint
	for _, v := range p.httpEndpoints {
		ep, err := parseEndpoint(v)
		if err != nil {
			// The value holds the URL: never print its secrets.
			return redact.Error(fmt.Errorf("--http-tool-endpoint %q: %w", v, err))
		}
		eps = append(eps, ep)
	}
	tool, err := tools.NewHTTPRequest(&http.Client{Timeout: 60 * time.Second}, eps)
	if err != nil {
		return redact.Error(fmt.Errorf("--http-tool-endpoint: %w", err))
	}
	return reg.Register(tool)
}

// parseEndpoint reads name=N,url=U[,method=M][,class=idempotent|side_effecting].
func parseEndpoint(v string) (tools.Endpoint, error) {
	var ep tools.Endpoint
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return ep, fmt.Errorf("want key=value pairs (name, url, method, class), got %q", kv)
		}
		switch k {
		case "name":
			ep.Name = val
		case "url":
			ep.URL = val
		case "method":
			ep.Method = strings.ToUpper(val)
		case "class":
			c, err := tools.ParseClass(val)
			if err != nil {
				return ep, err
			}
			ep.Class = c
		default:
			return ep, fmt.Errorf("unknown key %q (want name, url, method, class)", k)
		}
	}
	if ep.Name == "" || ep.URL == "" {
		return ep, fmt.Errorf("name and url are required")
	}
	return ep, nil
}
