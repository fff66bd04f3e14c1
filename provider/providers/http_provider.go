package providers

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	urlredact "github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/provider"
)

// HTTPConfig configures the HTTP provider.
type HTTPConfig struct {
	// URL receives one POST per provider step. Required; http or https.
	URL string
	// Timeout bounds one provider step, from dial to the end of the
	// response body. Defaults to 120s.
	Timeout time.Duration
	// HonoursIdempotencyKeys declares that the server deduplicates steps
	// by their Idempotency-Key header, so that a step whose outcome is
	// uncertain may be sent again with the same key. Declare it only when
	// it is true: it switches off P4's "never repeat" for this provider.
	// Defaults to false.
	HonoursIdempotencyKeys bool
	// Headers are extra static headers sent with every request (for
	// example an Authorization header); they cannot replace Content-Type,
	// Accept, Idempotency-Key, X-Idempotency-Key or X-Fencing-Token. Their values are treated
	// as secrets: String and LogValue print only their names. Defaults to
	// none.
	Headers map[string]string
}

// Validate reports whether the config can be used.
func (c *HTTPConfig) Validate() error {
	if err := validateURL("URL", c.URL); err != nil {
		return fmt.Errorf("http provider config: %w", err)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("http provider config: Timeout %s is negative", c.Timeout)
	}
	return nil
}

// String describes the config without the values of Headers.
func (c HTTPConfig) String() string {
	return fmt.Sprintf("HTTPConfig{URL: %q, Timeout: %s, HonoursIdempotencyKeys: %t, Headers: %s}",
		urlredact.URL(c.URL), c.Timeout, c.HonoursIdempotencyKeys, headerNames(c.Headers))
}

// GoString is String, so that %#v cannot print header values either.
func (c HTTPConfig) GoString() string { return c.String() }

// LogValue describes the config without the values of Headers.
func (c HTTPConfig) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", urlredact.URL(c.URL)),
		slog.Duration("timeout", c.Timeout),
		slog.Bool("honours_idempotency_keys", c.HonoursIdempotencyKeys),
		slog.String("headers", headerNames(c.Headers)),
	)
}

func headerNames(h map[string]string) string {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name+": "+redacted)
	}
	slices.Sort(names)
	return "[" + strings.Join(names, ", ") + "]"
}

// HTTP is a provider that POSTs each step, as documented JSON, to a URL
// (see docs/providers.md): any service in any language can be the model.
type HTTP struct {
	client *http.Client
	config HTTPConfig
}

var (
	_ provider.Provider           = (*HTTP)(nil)
	_ provider.IdempotentProvider = (*HTTP)(nil)
)

// NewHTTP returns an HTTP provider that sends its requests through a copy
// of client (http.DefaultClient when nil) that does not follow redirects.
// The config is copied. NewHTTP does not validate it: call
// HTTPConfig.Validate at startup; an invalid config makes every Complete
// fail, before anything is sent.
func NewHTTP(client *http.Client, config *HTTPConfig) *HTTP {
	var c HTTPConfig
	if config != nil {
		c = *config
	}
	c.Timeout = cmp.Or(c.Timeout, timeoutDefault)
	c.Headers = cloneHeaders(c.Headers)
	return &HTTP{client: noRedirects(client), config: c}
}

// HonoursIdempotencyKeys reports HTTPConfig.HonoursIdempotencyKeys.
func (p *HTTP) HonoursIdempotencyKeys() bool { return p.config.HonoursIdempotencyKeys }

// String describes the provider without secrets.
// Without it, fmt would print the unexported config field, header values
// included.
func (p *HTTP) String() string { return "providers.HTTP{" + p.config.String() + "}" }

// GoString is String.
func (p *HTTP) GoString() string { return p.String() }

// LogValue is the config's LogValue.
func (p *HTTP) LogValue() slog.Value { return p.config.LogValue() }

// Complete POSTs the step and decodes the answer.
func (p *HTTP) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	if err := p.config.Validate(); err != nil {
		return provider.Response{}, fmt.Errorf("%w: %w", provider.ErrNotSent, err)
	}
	body, err := encodeHTTPRequest(req)
	if err != nil {
		return provider.Response{}, fmt.Errorf("http provider: encoding step %s: %w", req.AttemptID, err)
	}
	raw, err := exchange(ctx, p.client, exchangeOpts{
		URL:                    p.config.URL,
		Body:                   body,
		Headers:                p.config.Headers,
		IdempotencyKey:         req.IdempotencyKey,
		HonoursIdempotencyKeys: p.config.HonoursIdempotencyKeys,
		FencingToken:           req.FencingToken,
		ResponseIDFunc:         req.ResponseIDFunc,
		Timeout:                p.config.Timeout,
	})
	if err != nil {
		return provider.Response{}, wrapStepError("http provider", req.AttemptID, err)
	}
	resp, err := decodeHTTPResponse(raw)
	if err != nil {
		return provider.Response{}, fmt.Errorf("http provider: step %s: malformed response: %w", req.AttemptID, err)
	}
	return resp, nil
}

// The wire format of the HTTP provider; docs/providers.md documents it and
// ExampleHTTP pins it.
type (
	httpRequest struct {
		SessionID          string        `json:"session_id"`
		AssistantMessageID string        `json:"assistant_message_id"`
		AttemptID          string        `json:"attempt_id"`
		TurnMessageIDs     []string      `json:"turn_message_ids"`
		Messages           []httpMessage `json:"messages"`
		Tools              []httpTool    `json:"tools"`
	}
	httpMessage struct {
		ID         string         `json:"id"`
		Role       string         `json:"role"`
		Text       string         `json:"text"`
		ToolCalls  []httpToolCall `json:"tool_calls,omitempty"`
		ToolCallID string         `json:"tool_call_id,omitempty"`
		IsError    bool           `json:"is_error,omitempty"`
	}
	httpToolCall struct {
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	httpTool struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	httpResponse struct {
		Text      *string         `json:"text"`
		ToolCalls *[]httpToolCall `json:"tool_calls"`
		Usage     *httpUsage      `json:"usage"`
	}
	httpUsage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	}
)

func encodeHTTPRequest(req provider.Request) ([]byte, error) {
	out := httpRequest{
		SessionID:          req.SessionID,
		AssistantMessageID: req.AssistantMessageID,
		AttemptID:          req.AttemptID,
		TurnMessageIDs:     make([]string, 0, len(req.Turn)),
		Messages:           make([]httpMessage, 0, len(req.Messages)),
		Tools:              make([]httpTool, 0, len(req.Tools)),
	}
	for _, m := range req.Turn {
		out.TurnMessageIDs = append(out.TurnMessageIDs, m.ID)
	}
	for _, m := range req.Messages {
		if err := checkRole(m); err != nil {
			return nil, err
		}
		hm := httpMessage{ID: m.ID, Role: m.Role, Text: m.Text, ToolCallID: m.ToolCallID, IsError: m.IsError}
		for _, c := range m.ToolCalls {
			hm.ToolCalls = append(hm.ToolCalls, httpToolCall{ID: c.ID, Name: c.Name, Input: pastCallInput(c.Input)})
		}
		out.Messages = append(out.Messages, hm)
	}
	for _, t := range req.Tools {
		schema, err := jsonObject(t.InputSchema, `{"type":"object"}`)
		if err != nil {
			return nil, fmt.Errorf("tool %s: input schema: %w: %w", t.Name, err, provider.ErrUnsupported)
		}
		out.Tools = append(out.Tools, httpTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return json.Marshal(out)
}

// decodeHTTPResponse decodes and checks a 2xx body: a JSON object with
// "text", "tool_calls" or both; every tool call with an id, a name and an
// object as input; usage optional.
func decodeHTTPResponse(raw []byte) (provider.Response, error) {
	var r httpResponse
	if err := decodeObject(raw, &r); err != nil {
		return provider.Response{}, err
	}
	if r.Text == nil && r.ToolCalls == nil {
		return provider.Response{}, errors.New(`neither "text" nor "tool_calls" is present`)
	}
	var resp provider.Response
	if r.Text != nil {
		resp.Text = *r.Text
	}
	if r.ToolCalls != nil {
		for i, c := range *r.ToolCalls {
			if c.Input == nil {
				return provider.Response{}, fmt.Errorf("tool_calls[%d]: \"input\" is missing", i)
			}
			call, err := checkToolCall(i, c.ID, c.Name, "input", c.Input)
			if err != nil {
				return provider.Response{}, err
			}
			resp.ToolCalls = append(resp.ToolCalls, call)
		}
	}
	if err := checkToolCallIDs(resp.ToolCalls); err != nil {
		return provider.Response{}, err
	}
	if r.Usage != nil {
		if r.Usage.InputTokens < 0 || r.Usage.OutputTokens < 0 {
			return provider.Response{}, fmt.Errorf("usage has negative token counts (%d, %d)", r.Usage.InputTokens, r.Usage.OutputTokens)
		}
		resp.Usage = provider.Usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens}
	}
	return resp, nil
}

// decodeObject unmarshals raw, which must be one JSON object.
func decodeObject(raw []byte, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return fmt.Errorf("body is not a JSON object: %q", excerpt(raw))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	return nil
}

// checkToolCall checks one tool call the model requested.
// field names the input in the wire format, for the error message.
func checkToolCall(i int, id, name, field string, input []byte) (provider.ToolCall, error) {
	if id == "" {
		return provider.ToolCall{}, fmt.Errorf("tool call %d: \"id\" is missing or empty", i)
	}
	if name == "" {
		return provider.ToolCall{}, fmt.Errorf("tool call %d (%s): \"name\" is missing or empty", i, id)
	}
	obj, err := jsonObject(input, "")
	if err != nil {
		return provider.ToolCall{}, fmt.Errorf("tool call %d (%s, %s): %s: %w", i, id, name, field, err)
	}
	return provider.ToolCall{ID: id, Name: name, Input: obj}, nil
}

// checkToolCallIDs rejects an answer that names two calls alike: results
// are matched to calls by ID.
func checkToolCallIDs(calls []provider.ToolCall) error {
	seen := make(map[string]bool, len(calls))
	for _, c := range calls {
		if seen[c.ID] {
			return fmt.Errorf("tool call id %q is used twice", c.ID)
		}
		seen[c.ID] = true
	}
	return nil
}

// pastCallInput is the input of a tool call of the transcript as the
// provider is sent it: a JSON object, {} when the model's input was not
// one (or not storable as JSON: the executor stored its text, and the
// call failed its tool's input schema, recorded in its result). Refusing
// it would fail every later step of the session, for good: the
// transcript keeps the call.
func pastCallInput(raw []byte) json.RawMessage {
	obj, err := jsonObject(raw, "{}")
	if err != nil {
		return json.RawMessage("{}")
	}
	return obj
}

// jsonObject returns raw, compacted, when it is one JSON object; def when
// raw is empty and def is not.
func jsonObject(raw []byte, def string) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 && def != "" {
		return json.RawMessage(def), nil
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return nil, fmt.Errorf("not a JSON object: %q", excerpt(raw))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func excerpt(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

func checkRole(m provider.TranscriptMessage) error {
	switch m.Role {
	case "user", "assistant":
		return nil
	case "tool":
		if m.ToolCallID == "" {
			return fmt.Errorf("message %s: tool result without a tool call id: %w", m.ID, provider.ErrUnsupported)
		}
		return nil
	}
	return fmt.Errorf("message %s: unknown role %q: %w", m.ID, m.Role, provider.ErrUnsupported)
}

// wrapStepError says which provider and step failed, keeping the error's
// class: a *provider.RetryAfterError stays the outermost error, so that a
// caller can type-assert it as well as errors.As it.
func wrapStepError(name, attemptID string, err error) error {
	var ra *provider.RetryAfterError
	if errors.As(err, &ra) {
		return &provider.RetryAfterError{After: ra.After, Err: fmt.Errorf("%s: step %s: %w", name, attemptID, ra.Err)}
	}
	return fmt.Errorf("%s: step %s: %w", name, attemptID, err)
}

func validateURL(field, raw string) error {
	if raw == "" {
		return fmt.Errorf("%s is required", field)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", field, urlredact.Error(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s %q is not an absolute http or https URL", field, urlredact.URL(raw))
	}
	return nil
}

func cloneHeaders(h map[string]string) map[string]string {
	if h == nil {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = v
	}
	return out
}
