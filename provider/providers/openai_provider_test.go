package providers_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

const testKey = "sk-test-0123456789abcdefSECRET"

type openAIBundle struct {
	server   *fakeServer
	config   *providers.OpenAIConfig
	provider *providers.OpenAI
}

func setupOpenAI(t *testing.T, respond func(http.ResponseWriter, *http.Request, int)) *openAIBundle {
	t.Helper()
	server := startFakeServer(t, respond)
	config := &providers.OpenAIConfig{
		BaseURL:      server.srv.URL + "/v1/",
		Model:        "gpt-test",
		APIKey:       testKey,
		SystemPrompt: "You are terse.",
		MaxTokens:    256,
	}
	provider, err := providers.NewOpenAI(server.srv.Client(), config)
	require.NoError(t, err)
	return &openAIBundle{server: server, config: config, provider: provider}
}

func TestOpenAI(t *testing.T) {
	t.Parallel()

	t.Run("RequestMappingAndToolCallsParsed", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(200, `{
			"id": "chatcmpl-1",
			"object": "chat.completion",
			"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
				"role": "assistant",
				"content": null,
				"tool_calls": [
					{"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Lyon\"}"}},
					{"id": "call_b", "type": "function", "function": {"name": "news", "arguments": "{}"}}
				]
			}}],
			"usage": {"prompt_tokens": 321, "completion_tokens": 12, "total_tokens": 333}
		}`))

		resp, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		require.Equal(t, provider.Response{
			ToolCalls: []provider.ToolCall{
				{ID: "call_a", Name: "weather", Input: []byte(`{"city":"Lyon"}`)},
				{ID: "call_b", Name: "news", Input: []byte(`{}`)},
			},
			Usage: provider.Usage{InputTokens: 321, OutputTokens: 12},
		}, resp)

		got := bundle.server.next(t)
		require.Equal(t, http.MethodPost, got.Method)
		require.Equal(t, "/v1/chat/completions", got.Path)
		require.Equal(t, "Bearer "+testKey, got.Header.Get("Authorization"))
		require.Equal(t, "e-1/2/key", got.Header.Get("Idempotency-Key"))
		require.Equal(t, "42", got.Header.Get("X-Fencing-Token"))
		require.Equal(t, "application/json", got.Header.Get("Content-Type"))
		require.JSONEq(t, `{
			"model": "gpt-test",
			"max_completion_tokens": 256,
			"messages": [
				{"role": "system", "content": "You are terse."},
				{"role": "user", "content": "What is the weather in Paris?"},
				{"role": "assistant", "content": "Let me look.", "tool_calls": [
					{"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
					{"id": "call-2", "type": "function", "function": {"name": "news", "arguments": "{\"city\":\"Paris\"}"}}
				]},
				{"role": "tool", "tool_call_id": "call-1", "content": "18°C, clear"},
				{"role": "tool", "tool_call_id": "call-2", "content": "error: outcome unknown after restart"}
			],
			"tools": [
				{"type": "function", "function": {"name": "weather", "description": "Current weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
				{"type": "function", "function": {"name": "news", "description": "Headlines."}}
			]
		}`, string(got.Body))
	})

	// The answer's bound goes under the name the server knows: reasoning
	// models refuse "max_tokens"; older compatible servers know only it.
	t.Run("MaxTokensField", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			config providers.OpenAIConfig
			want   string
		}{
			"Default": {providers.OpenAIConfig{MaxTokens: 64}, `"max_completion_tokens":64`},
			"Legacy":  {providers.OpenAIConfig{MaxTokens: 64, LegacyMaxTokens: true}, `"max_tokens":64`},
			"Unset":   {providers.OpenAIConfig{LegacyMaxTokens: true}, ""},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				server := startFakeServer(t, reply(200, `{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`))
				config := tc.config
				config.BaseURL, config.Model, config.APIKey = server.srv.URL+"/v1", "m", testKey
				provider, err := providers.NewOpenAI(server.srv.Client(), &config)
				require.NoError(t, err)

				_, err = provider.Complete(context.Background(), sampleRequest())
				require.NoError(t, err)
				body := string(server.next(t).Body)
				for _, field := range []string{`"max_completion_tokens"`, `"max_tokens"`} {
					require.Equal(t, tc.want != "" && strings.HasPrefix(tc.want, field), strings.Contains(body, field), "%s in %s", field, body)
				}
				if tc.want != "" {
					require.Contains(t, body, tc.want)
				}
			})
		}
	})

	t.Run("ToolOnlyAssistantSendsNullContentAndNoTools", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(200, `{"choices":[{"message":{"role":"assistant","content":"ok"}}]}`))
		req := sampleRequest()
		req.Messages[1].Text = ""
		req.Tools = nil

		_, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)

		got := bundle.server.next(t)
		require.NotContains(t, string(got.Body), `"tools"`, "an empty tools array is rejected by the API")
		require.Contains(t, string(got.Body), `{"role":"assistant","content":null,"tool_calls":[`)
	})

	t.Run("TextParsed", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(200, `{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"18°C and clear."}}],"usage":{"prompt_tokens":5,"completion_tokens":6}}`))

		resp, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		require.Equal(t, provider.Response{Text: "18°C and clear.", Usage: provider.Usage{InputTokens: 5, OutputTokens: 6}}, resp)
	})

	t.Run("MalformedResponses", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct{ body, wantErr string }{
			"InvalidArgumentsJSON": {`{"choices":[{"message":{"tool_calls":[{"id":"c","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Ly"}}]}}]}`, "arguments: not a JSON object"},
			"ArgumentsNotObject":   {`{"choices":[{"message":{"tool_calls":[{"id":"c","type":"function","function":{"name":"weather","arguments":"[1]"}}]}}]}`, "arguments: not a JSON object"},
			"ArgumentsMissing":     {`{"choices":[{"message":{"tool_calls":[{"id":"c","type":"function","function":{"name":"weather"}}]}}]}`, `"arguments" is missing`},
			"FunctionMissing":      {`{"choices":[{"message":{"tool_calls":[{"id":"c","type":"function"}]}}]}`, `"function" is missing`},
			"OtherToolType":        {`{"choices":[{"message":{"tool_calls":[{"id":"c","type":"custom","function":{"name":"x","arguments":"{}"}}]}}]}`, `type "custom" is not supported`},
			"NoChoices":            {`{"choices":[]}`, `"choices" is missing or empty`},
			"ErrorIn200":           {`{"error":{"message":"model overloaded","type":"server_error"}}`, "model overloaded"},
			"NoMessage":            {`{"choices":[{"index":0}]}`, `no "message"`},
			"EmptyMessage":         {`{"choices":[{"message":{"role":"assistant"}}]}`, `neither "content" nor "tool_calls"`},
			"BadJSON":              {`{"choices":`, "decoding JSON"},
			"EmptyBody":            {``, "empty body"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupOpenAI(t, reply(200, tc.body))

				_, err := bundle.provider.Complete(context.Background(), sampleRequest())
				requireClass(t, err, plain)
				require.ErrorContains(t, err, "malformed response")
				require.ErrorContains(t, err, tc.wantErr)
			})
		}
	})

	t.Run("TooManyRequestsIsRetryAfter", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "20")
			reply(429, `{"error":{"message":"Rate limit reached","type":"requests"}}`)(w, r, n)
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, retryAfter)
		var ra *provider.RetryAfterError
		require.ErrorAs(t, err, &ra)
		require.Equal(t, 20*time.Second, ra.After)
		require.ErrorContains(t, err, "Rate limit reached")
	})

	// A wrong key or an unknown model is refused as sent: never retried.
	t.Run("UnauthorizedIsRejected", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}`))

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, rejected)
		require.ErrorContains(t, err, "Incorrect API key provided")
	})

	t.Run("ConnectionRefusedIsNotSent", func(t *testing.T) {
		t.Parallel()
		provider, err := providers.NewOpenAI(nil, &providers.OpenAIConfig{BaseURL: "http://" + closedAddr(t) + "/v1", Model: "m", APIKey: testKey})
		require.NoError(t, err)

		_, err = provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, notSent)
		require.NotContains(t, err.Error(), testKey)
	})

	t.Run("KeyNeverInErrors", func(t *testing.T) {
		t.Parallel()
		// Servers echo a rejected key; so may a broken 200.
		for name, respond := range map[string]func(http.ResponseWriter, *http.Request, int){
			"Unauthorized":    reply(401, `{"error":{"message":"Incorrect API key provided: `+testKey+`."}}`),
			"CutAtExcerpt":    reply(401, strings.Repeat("x", 500)+testKey),
			"RateLimited":     reply(429, `{"error":"`+testKey+`"}`),
			"MalformedOK":     reply(200, `{"choices":[{"message":{"tool_calls":[{"id":"`+testKey+`","function":{"name":"x","arguments":"{"}}]}}]}`),
			"HeaderEchoedOK":  reply(200, `{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"`+testKey+`","arguments":"{"}}]}}]}`),
			"NotAnObject200":  reply(200, `"`+testKey+`"`),
			"ServerErrorLong": reply(500, strings.Repeat(testKey, 100)),
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupOpenAI(t, respond)

				_, err := bundle.provider.Complete(context.Background(), sampleRequest())
				require.Error(t, err)
				require.NotContains(t, err.Error(), testKey)
				require.NotContains(t, err.Error(), testKey[:12], "not even a prefix")
			})
		}
	})

	t.Run("KeyNeverPrinted", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(200, `{}`))
		var logged bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&logged, nil))
		logger.Info("config", "config", *bundle.config, "ptr", bundle.config, "provider", bundle.provider)
		slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "config", bundle.config)
		require.Contains(t, logged.String(), "gpt-test")

		outputs := []string{logged.String()}
		for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
			for _, v := range []any{*bundle.config, bundle.config, bundle.provider} {
				outputs = append(outputs, fmt.Sprintf(format, v))
			}
		}
		for _, out := range outputs {
			require.NotContains(t, out, testKey)
			require.NotContains(t, out, testKey[:12])
		}
		require.Contains(t, fmt.Sprintf("%v", bundle.config), "APIKey: [REDACTED]")
	})

	t.Run("ConfigValidation", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			config  providers.OpenAIConfig
			wantErr string
		}{
			"NoModel":     {providers.OpenAIConfig{APIKey: testKey}, "Model is required"},
			"NoKey":       {providers.OpenAIConfig{Model: "m", APIKey: " \n"}, "APIKey is required"},
			"BadBaseURL":  {providers.OpenAIConfig{Model: "m", APIKey: testKey, BaseURL: "api.example.com"}, "BaseURL"},
			"NegTimeout":  {providers.OpenAIConfig{Model: "m", APIKey: testKey, Timeout: -time.Second}, "Timeout"},
			"NegMaxToken": {providers.OpenAIConfig{Model: "m", APIKey: testKey, MaxTokens: -1}, "MaxTokens"},
		} {
			_, err := providers.NewOpenAI(nil, &tc.config)
			require.ErrorContains(t, err, tc.wantErr, name)
			require.NotContains(t, err.Error(), testKey, name)
		}

		provider, err := providers.NewOpenAI(nil, &providers.OpenAIConfig{Model: "m", APIKey: testKey})
		require.NoError(t, err)
		require.Contains(t, provider.String(), `BaseURL: "https://api.openai.com/v1"`)
		require.Contains(t, provider.String(), "Timeout: 2m0s")
		require.False(t, provider.HonoursIdempotencyKeys())
	})
}

func TestLoadAPIKey(t *testing.T) {
	t.Parallel()

	// t.Setenv cannot be used in parallel tests; names unique to this test
	// keep os.Setenv from touching anything else.
	setenv := func(t *testing.T, name, value string) {
		t.Helper()
		require.NoError(t, os.Setenv(name, value))
		t.Cleanup(func() { _ = os.Unsetenv(name) })
	}
	writeFile := func(t *testing.T, content string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "openai.key")
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}

	t.Run("FromFileTrimmed", func(t *testing.T) {
		t.Parallel()
		key, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_UNSET_1", writeFile(t, "  "+testKey+"\n"))
		require.NoError(t, err)
		require.Equal(t, testKey, key)
	})

	t.Run("FileWinsOverEnv", func(t *testing.T) {
		t.Parallel()
		setenv(t, "PROMPTLINE_TEST_KEY_BOTH", "from-env")
		key, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_BOTH", writeFile(t, "from-file"))
		require.NoError(t, err)
		require.Equal(t, "from-file", key)
	})

	t.Run("FromEnvTrimmed", func(t *testing.T) {
		t.Parallel()
		setenv(t, "PROMPTLINE_TEST_KEY_ENV", "\t"+testKey+" \n")
		key, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_ENV", "")
		require.NoError(t, err)
		require.Equal(t, testKey, key)
	})

	t.Run("EmptyFileNamesFile", func(t *testing.T) {
		t.Parallel()
		path := writeFile(t, " \n\t")
		_, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_UNSET_2", path)
		require.ErrorContains(t, err, path)
		require.ErrorContains(t, err, "empty")
	})

	t.Run("MissingFileNamesFile", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "absent.key")
		_, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_UNSET_3", path)
		require.ErrorIs(t, err, os.ErrNotExist)
		require.ErrorContains(t, err, path)
	})

	t.Run("UnsetEnvNamesVariable", func(t *testing.T) {
		t.Parallel()
		_, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_UNSET_4", "")
		require.ErrorContains(t, err, "PROMPTLINE_TEST_KEY_UNSET_4")
	})

	t.Run("BlankEnvNamesVariable", func(t *testing.T) {
		t.Parallel()
		setenv(t, "PROMPTLINE_TEST_KEY_BLANK", "  ")
		_, err := providers.LoadAPIKey("PROMPTLINE_TEST_KEY_BLANK", "")
		require.ErrorContains(t, err, "PROMPTLINE_TEST_KEY_BLANK")
	})

	t.Run("NoSource", func(t *testing.T) {
		t.Parallel()
		_, err := providers.LoadAPIKey("", "")
		require.ErrorContains(t, err, "no API key source")
	})
}
