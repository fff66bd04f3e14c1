package providers

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
	"strings"
	"time"

	"github.com/promptline/promptline/provider"
)

// OpenAIConfig configures the OpenAI provider.
type OpenAIConfig struct {
	// BaseURL of an OpenAI-compatible API; requests go to
	// BaseURL + "/chat/completions". Defaults to https://api.openai.com/v1.
	BaseURL string
	// Model is the model name sent with every request. Required.
	Model string
	// APIKey is sent as "Authorization: Bearer APIKey". Resolve it with
	// LoadAPIKey from an environment variable or a file; never put it in
	// a config file. String, GoString and LogValue print it redacted.
	// Required.
	APIKey string
	// SystemPrompt, when set, is sent as the first message, with role
	// "system". Defaults to none.
	SystemPrompt string
	// Timeout bounds one provider step, from dial to the end of the
	// response body. Defaults to 120s.
	Timeout time.Duration
	// HonoursIdempotencyKeys declares that the server deduplicates
	// requests by their Idempotency-Key header, so that a step whose
	// outcome is uncertain may be sent again with the same key. Declare it
	// only when it is true of the server (api.openai.com does not document
	// it). Defaults to false.
	HonoursIdempotencyKeys bool
	// MaxTokens, when positive, bounds the tokens of each answer, sent as
	// "max_completion_tokens" (the Chat Completions name since "max_tokens"
	// was deprecated; reasoning models refuse "max_tokens"). Defaults to 0:
	// omitted, the server decides.
	MaxTokens int
	// LegacyMaxTokens sends MaxTokens as "max_tokens" instead, for
	// compatible servers that predate "max_completion_tokens".
	LegacyMaxTokens bool
	// Stream asks for the answer as a stream (stream: true, with
	// stream_options include_usage): its text reaches
	// provider.Request.TextDeltaFunc as it arrives (live deltas). The
	// answer, its tool calls and usage are the same as without it, and
	// are committed at the end of the step as always. Defaults to false.
	Stream bool
}

const openAIBaseURLDefault = "https://api.openai.com/v1"

// Validate reports whether the config can be used. Its errors never hold
// the API key.
func (c *OpenAIConfig) Validate() error {
	if err := validateURL("BaseURL", cmp.Or(c.BaseURL, openAIBaseURLDefault)); err != nil {
		return fmt.Errorf("openai provider config: %w", err)
	}
	switch {
	case c.Model == "":
		return errors.New("openai provider config: Model is required")
	case strings.TrimSpace(c.APIKey) == "":
		return errors.New("openai provider config: APIKey is required (see LoadAPIKey)")
	case c.Timeout < 0:
		return fmt.Errorf("openai provider config: Timeout %s is negative", c.Timeout)
	case c.MaxTokens < 0:
		return fmt.Errorf("openai provider config: MaxTokens %d is negative", c.MaxTokens)
	}
	return nil
}

// String describes the config with the API key redacted.
func (c OpenAIConfig) String() string {
	return fmt.Sprintf("OpenAIConfig{BaseURL: %q, Model: %q, APIKey: %s, SystemPrompt: %d bytes, Timeout: %s, HonoursIdempotencyKeys: %t, MaxTokens: %d, LegacyMaxTokens: %t, Stream: %t}",
		c.BaseURL, c.Model, redactedKey(c.APIKey), len(c.SystemPrompt), c.Timeout, c.HonoursIdempotencyKeys, c.MaxTokens, c.LegacyMaxTokens, c.Stream)
}

// GoString is String, so that %#v cannot print the key either.
func (c OpenAIConfig) GoString() string { return c.String() }

// LogValue describes the config with the API key redacted.
func (c OpenAIConfig) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("base_url", c.BaseURL),
		slog.String("model", c.Model),
		slog.String("api_key", redactedKey(c.APIKey)),
		slog.Int("system_prompt_bytes", len(c.SystemPrompt)),
		slog.Duration("timeout", c.Timeout),
		slog.Bool("honours_idempotency_keys", c.HonoursIdempotencyKeys),
		slog.Int("max_tokens", c.MaxTokens),
		slog.Bool("legacy_max_tokens", c.LegacyMaxTokens),
		slog.Bool("stream", c.Stream),
	)
}

func redactedKey(key string) string {
	if key == "" {
		return "(unset)"
	}
	return redacted
}

// LoadAPIKey reads an API key from file when file is not empty, else from
// the environment variable envName, and trims surrounding whitespace.
// Its errors name the file or the variable, never the key.
func LoadAPIKey(envName, file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("reading API key file: %w", err)
		}
		key := strings.TrimSpace(string(b))
		if key == "" {
			return "", fmt.Errorf("API key file %s is empty", file)
		}
		return key, nil
	}
	if envName == "" {
		return "", errors.New("no API key source: give an environment variable or a file")
	}
	key := strings.TrimSpace(os.Getenv(envName))
	if key == "" {
		return "", fmt.Errorf("API key environment variable %s is not set or empty", envName)
	}
	return key, nil
}

// OpenAI is a provider that speaks the Chat Completions API with tool
// calling, to api.openai.com or any compatible server.
type OpenAI struct {
	client *http.Client
	config OpenAIConfig
	url    string
}

var (
	_ provider.Provider           = (*OpenAI)(nil)
	_ provider.IdempotentProvider = (*OpenAI)(nil)
)

// NewOpenAI returns an OpenAI provider that sends its requests through a
// copy of client (http.DefaultClient when nil) that does not follow
// redirects. The config is copied and validated.
func NewOpenAI(client *http.Client, config *OpenAIConfig) (*OpenAI, error) {
	if config == nil {
		config = &OpenAIConfig{}
	}
	if err := config.Validate(); err != nil {
		return nil, err
	}
	c := *config
	c.BaseURL = cmp.Or(c.BaseURL, openAIBaseURLDefault)
	c.Timeout = cmp.Or(c.Timeout, timeoutDefault)
	c.APIKey = strings.TrimSpace(c.APIKey)
	return &OpenAI{
		client: noRedirects(client),
		config: c,
		url:    strings.TrimRight(c.BaseURL, "/") + "/chat/completions",
	}, nil
}

// HonoursIdempotencyKeys reports OpenAIConfig.HonoursIdempotencyKeys.
func (p *OpenAI) HonoursIdempotencyKeys() bool { return p.config.HonoursIdempotencyKeys }

// ModelName is the configured model, recorded with each attempt.
func (p *OpenAI) ModelName() string { return p.config.Model }

var _ provider.ModelNamer = (*OpenAI)(nil)

// String describes the provider with the API key redacted. Without it,
// fmt would print the unexported config field, key included.
func (p *OpenAI) String() string { return "providers.OpenAI{" + p.config.String() + "}" }

// GoString is String.
func (p *OpenAI) GoString() string { return p.String() }

// LogValue is the config's LogValue.
func (p *OpenAI) LogValue() slog.Value { return p.config.LogValue() }

// Complete sends the transcript to /chat/completions and decodes the
// first choice.
func (p *OpenAI) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	body, err := p.encodeRequest(req)
	if err != nil {
		return provider.Response{}, fmt.Errorf("openai provider: encoding step %s: %w", req.AttemptID, err)
	}
	opts := exchangeOpts{
		URL:                    p.url,
		Body:                   body,
		Headers:                map[string]string{"Authorization": "Bearer " + p.config.APIKey},
		Secret:                 p.config.APIKey,
		IdempotencyKey:         req.IdempotencyKey,
		HonoursIdempotencyKeys: p.config.HonoursIdempotencyKeys,
		FencingToken:           req.FencingToken,
		Timeout:                p.config.Timeout,
		ResponseIDFunc:         req.ResponseIDFunc,
	}
	var malformed error
	if p.config.Stream {
		opts.Accept = "text/event-stream"
		opts.StreamFunc = func(contentType string, body io.Reader) ([]byte, error) {
			raw, err := readOpenAIStream(body, contentType, req.TextDeltaFunc, req.ResponseIDFunc)
			var m *errMalformedStream
			if errors.As(err, &m) {
				malformed = m
				return nil, errors.New("malformed stream")
			}
			return raw, err
		}
	}
	raw, err := exchange(ctx, p.client, opts)
	if malformed != nil {
		return provider.Response{}, fmt.Errorf("openai provider: step %s: malformed response: %s", req.AttemptID, redact(malformed.Error(), p.config.APIKey))
	}
	if err != nil {
		return provider.Response{}, wrapStepError("openai provider", req.AttemptID, err)
	}
	resp, err := decodeOpenAIResponse(raw)
	if err != nil {
		// The chain of a decoding error carries no class; its text is
		// rebuilt so that no part of the body can carry the key out.
		return provider.Response{}, fmt.Errorf("openai provider: step %s: malformed response: %s", req.AttemptID, redact(err.Error(), p.config.APIKey))
	}
	return resp, nil
}

// The Chat Completions wire format, as far as promptline uses it.
type (
	openAIRequest struct {
		Model    string          `json:"model"`
		Messages []openAIMessage `json:"messages"`
		Tools    []openAITool    `json:"tools,omitempty"`
		// Exactly one of the two is set when OpenAIConfig.MaxTokens is.
		MaxCompletionTokens int `json:"max_completion_tokens,omitempty"`
		MaxTokens           int `json:"max_tokens,omitempty"`
		// Set when OpenAIConfig.Stream is.
		Stream        bool                 `json:"stream,omitempty"`
		StreamOptions *openAIStreamOptions `json:"stream_options,omitempty"`
	}
	openAIMessage struct {
		Role string `json:"role"`
		// Content is a pointer so that an assistant message that only
		// calls tools can send null, as the API does.
		Content    *string          `json:"content"`
		ToolCalls  []openAIToolCall `json:"tool_calls,omitempty"`
		ToolCallID string           `json:"tool_call_id,omitempty"`
	}
	openAIToolCall struct {
		ID       string             `json:"id"`
		Type     string             `json:"type"`
		Function openAIFunctionCall `json:"function"`
	}
	openAIFunctionCall struct {
		Name string `json:"name"`
		// Arguments is a JSON object encoded as a string.
		Arguments string `json:"arguments"`
	}
	openAITool struct {
		Type     string         `json:"type"`
		Function openAIFunction `json:"function"`
	}
	openAIFunction struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	openAIResponse struct {
		Choices []struct {
			Message *struct {
				Content   *string `json:"content"`
				Refusal   *string `json:"refusal"`
				ToolCalls *[]struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function *struct {
						Name      string  `json:"name"`
						Arguments *string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
		// Some compatible servers answer an error with status 200.
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
)

func (p *OpenAI) encodeRequest(req provider.Request) ([]byte, error) {
	out := openAIRequest{
		Model:    p.config.Model,
		Messages: make([]openAIMessage, 0, len(req.Messages)+1),
	}
	if p.config.Stream {
		out.Stream, out.StreamOptions = true, &openAIStreamOptions{IncludeUsage: true}
	}
	if p.config.LegacyMaxTokens {
		out.MaxTokens = p.config.MaxTokens
	} else {
		out.MaxCompletionTokens = p.config.MaxTokens
	}
	if p.config.SystemPrompt != "" {
		out.Messages = append(out.Messages, openAIMessage{Role: "system", Content: new(p.config.SystemPrompt)})
	}
	for _, m := range req.Messages {
		if err := checkRole(m); err != nil {
			return nil, err
		}
		switch m.Role {
		case "user":
			out.Messages = append(out.Messages, openAIMessage{Role: "user", Content: new(m.Text)})
		case "assistant":
			om := openAIMessage{Role: "assistant", Content: new(m.Text)}
			if m.Text == "" && len(m.ToolCalls) > 0 {
				om.Content = nil
			}
			for _, c := range m.ToolCalls {
				om.ToolCalls = append(om.ToolCalls, openAIToolCall{
					ID:       c.ID,
					Type:     "function",
					Function: openAIFunctionCall{Name: c.Name, Arguments: string(pastCallInput(c.Input))},
				})
			}
			out.Messages = append(out.Messages, om)
		case "tool":
			content := m.Text
			if m.IsError {
				content = "error: " + content
			}
			out.Messages = append(out.Messages, openAIMessage{Role: "tool", Content: &content, ToolCallID: m.ToolCallID})
		}
	}
	for _, t := range req.Tools {
		var params json.RawMessage
		if len(t.InputSchema) > 0 {
			schema, err := jsonObject(t.InputSchema, "")
			if err != nil {
				return nil, fmt.Errorf("tool %s: input schema: %w: %w", t.Name, err, provider.ErrUnsupported)
			}
			params = schema
		}
		out.Tools = append(out.Tools, openAITool{
			Type:     "function",
			Function: openAIFunction{Name: t.Name, Description: t.Description, Parameters: params},
		})
	}
	return json.Marshal(out)
}

// decodeOpenAIResponse decodes and checks a 2xx body: the first choice's
// message, with content, tool calls or both; each tool call a function
// whose arguments string holds a JSON object.
func decodeOpenAIResponse(raw []byte) (provider.Response, error) {
	var r openAIResponse
	if err := decodeObject(raw, &r); err != nil {
		return provider.Response{}, err
	}
	if len(r.Choices) == 0 {
		if r.Error != nil {
			return provider.Response{}, fmt.Errorf("server reported an error: %q (type %q, code %v)", r.Error.Message, r.Error.Type, r.Error.Code)
		}
		return provider.Response{}, errors.New(`"choices" is missing or empty`)
	}
	msg := r.Choices[0].Message
	if msg == nil {
		return provider.Response{}, errors.New(`choices[0] has no "message"`)
	}
	if msg.Content == nil && msg.ToolCalls == nil && msg.Refusal == nil {
		return provider.Response{}, errors.New(`choices[0].message has neither "content" nor "tool_calls"`)
	}
	var resp provider.Response
	switch {
	case msg.Content != nil:
		resp.Text = *msg.Content
	case msg.Refusal != nil:
		// A refusal is the model's answer, in a field of its own.
		resp.Text = *msg.Refusal
	}
	if msg.ToolCalls != nil {
		for i, c := range *msg.ToolCalls {
			if c.Type != "" && c.Type != "function" {
				return provider.Response{}, fmt.Errorf("tool call %d (%s): type %q is not supported", i, c.ID, c.Type)
			}
			if c.Function == nil {
				return provider.Response{}, fmt.Errorf("tool call %d (%s): \"function\" is missing", i, c.ID)
			}
			if c.Function.Arguments == nil {
				return provider.Response{}, fmt.Errorf("tool call %d (%s): \"arguments\" is missing", i, c.ID)
			}
			call, err := checkToolCall(i, c.ID, c.Function.Name, "arguments", []byte(*c.Function.Arguments))
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
		if r.Usage.PromptTokens < 0 || r.Usage.CompletionTokens < 0 {
			return provider.Response{}, fmt.Errorf("usage has negative token counts (%d, %d)", r.Usage.PromptTokens, r.Usage.CompletionTokens)
		}
		resp.Usage = provider.Usage{InputTokens: r.Usage.PromptTokens, OutputTokens: r.Usage.CompletionTokens}
	}
	return resp, nil
}
