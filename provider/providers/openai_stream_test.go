package providers_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

func setupOpenAIStream(t *testing.T, respond func(http.ResponseWriter, *http.Request, int)) *openAIBundle {
	t.Helper()
	bundle := setupOpenAI(t, respond)
	bundle.config.Stream = true
	p, err := providers.NewOpenAI(bundle.server.srv.Client(), bundle.config)
	require.NoError(t, err)
	bundle.provider = p
	return bundle
}

// sse answers with body as a text/event-stream.
func sse(body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	}
}

type fragments struct {
	mu  sync.Mutex
	got []string
}

func (f *fragments) add(s string) { f.mu.Lock(); f.got = append(f.got, s); f.mu.Unlock() }

func TestOpenAIStream(t *testing.T) {
	t.Parallel()

	t.Run("TextArrivesAsFragmentsAnswerAsWithoutStreaming", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
			testkit.OpenAIStreamHandler(testkit.OpenAIStreamConfig{
				Fragments: []string{"Hel", "lo, ", "wor", "ld"}, InputTokens: 9, OutputTokens: 4,
			})(w, r)
		})
		var f fragments
		req := sampleRequest()
		req.TextDeltaFunc = f.add
		resp, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)
		require.Equal(t, provider.Response{Text: "Hello, world", Usage: provider.Usage{InputTokens: 9, OutputTokens: 4}}, resp)
		require.Equal(t, []string{"Hel", "lo, ", "wor", "ld"}, f.got)

		got := bundle.server.next(t)
		require.Equal(t, "text/event-stream", got.Header.Get("Accept"))
		var body map[string]any
		require.NoError(t, json.Unmarshal(got.Body, &body))
		require.Equal(t, true, body["stream"])
		require.Equal(t, map[string]any{"include_usage": true}, body["stream_options"])
	})

	t.Run("ToolCallsAssembledFromFragments", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, sse(": keep-alive\n\n"+
			`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"weather","arguments":""}}]}}]}`+"\n\n"+
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`+"\n\n"+
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"Lyon\"}"}}]}}]}`+"\n\n"+
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"news","arguments":"{}"}}]}}]}`+"\n\n"+
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n"+
			`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}`+"\n\n"+
			"data: [DONE]\n\n"))
		var f fragments
		req := sampleRequest()
		req.TextDeltaFunc = f.add
		resp, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)
		require.Equal(t, provider.Response{
			ToolCalls: []provider.ToolCall{
				{ID: "call_a", Name: "weather", Input: []byte(`{"city":"Lyon"}`)},
				{ID: "call_b", Name: "news", Input: []byte(`{}`)},
			},
			Usage: provider.Usage{InputTokens: 3, OutputTokens: 2},
		}, resp)
		require.Empty(t, f.got, "no text, no fragments")
	})

	t.Run("JSONAnswerToAStreamRequestIsDecoded", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, reply(200, `{"choices":[{"message":{"content":"whole"}}]}`))
		resp, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		require.Equal(t, "whole", resp.Text)
	})

	t.Run("StreamCutOffIsOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, sse(`data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}`+"\n\n"))
		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.ErrorIs(t, err, provider.ErrOutcomeUnknown)
	})

	t.Run("MalformedChunkFailsTheStepWithoutTheKey", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, sse("data: {not json "+testKey+"\n\ndata: [DONE]\n\n"))
		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.ErrorContains(t, err, "malformed response")
		require.NotErrorIs(t, err, provider.ErrOutcomeUnknown)
		require.NotErrorIs(t, err, provider.ErrNotSent)
		require.NotContains(t, err.Error(), testKey)
	})

	t.Run("ErrorChunk", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, sse(`data: {"error":{"message":"overloaded","type":"server_error"}}`+"\n\n"))
		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.ErrorContains(t, err, "overloaded")
	})

	t.Run("StatusErrorsKeepTheirClass", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, reply(400, `{"error":{"message":"bad"}}`))
		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.ErrorIs(t, err, provider.ErrRejected)
	})

	t.Run("NotStreamingSendsNoStreamMember", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAI(t, reply(200, `{"choices":[{"message":{"content":"x"}}]}`))
		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		got := bundle.server.next(t)
		require.False(t, strings.Contains(string(got.Body), `"stream"`))
		require.Equal(t, "application/json", got.Header.Get("Accept"))
	})
}
