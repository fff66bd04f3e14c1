package providers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

type httpBundle struct {
	server   *fakeServer
	provider *providers.HTTP
}

func setupHTTP(t *testing.T, config *providers.HTTPConfig, respond func(http.ResponseWriter, *http.Request, int)) *httpBundle {
	t.Helper()
	server := startFakeServer(t, respond)
	if config == nil {
		config = &providers.HTTPConfig{}
	}
	config.URL = server.srv.URL + "/step"
	require.NoError(t, config.Validate())
	return &httpBundle{server: server, provider: providers.NewHTTP(server.srv.Client(), config)}
}

// errClass is how the executor reads a provider error.
type errClass int

const (
	// plain: none of the classes below; the server answered with a
	// failure (or, with ErrUnsupported, nothing was sent).
	plain errClass = iota
	notSent
	outcomeUnknown
	retryAfter
	rejected
)

// requireClass checks that err is in exactly one class, class.
func requireClass(t *testing.T, err error, class errClass) {
	t.Helper()
	require.Error(t, err)
	var ra *provider.RetryAfterError
	got := map[errClass]bool{
		notSent:        errors.Is(err, provider.ErrNotSent),
		outcomeUnknown: errors.Is(err, provider.ErrOutcomeUnknown),
		retryAfter:     errors.As(err, &ra),
		rejected:       errors.Is(err, provider.ErrRejected),
	}
	for c, is := range got {
		require.Equal(t, c == class, is, "class %d of %v", c, err)
	}
}

const okResponse = `{"text":"Sunny.","tool_calls":[],"usage":{"input_tokens":1,"output_tokens":2}}`

func TestHTTP(t *testing.T) {
	t.Parallel()

	t.Run("RequestMatchesContract", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, &providers.HTTPConfig{Headers: map[string]string{"Authorization": "Bearer static", "Idempotency-Key": "not-this-one"}}, reply(200, okResponse))

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)

		got := bundle.server.next(t)
		require.Equal(t, http.MethodPost, got.Method)
		require.Equal(t, "/step", got.Path)
		require.Equal(t, "application/json", got.Header.Get("Content-Type"))
		require.Equal(t, []string{"e-1/2/key"}, got.Header.Values("Idempotency-Key"))
		require.Equal(t, "42", got.Header.Get("X-Fencing-Token"))
		require.Equal(t, "Bearer static", got.Header.Get("Authorization"))
		require.JSONEq(t, `{
			"session_id": "s-1",
			"assistant_message_id": "a-1",
			"attempt_id": "e-1/2",
			"turn_message_ids": ["m-1"],
			"messages": [
				{"id": "m-1", "role": "user", "text": "What is the weather in Paris?"},
				{"id": "a-1", "role": "assistant", "text": "Let me look.", "tool_calls": [
					{"id": "call-1", "name": "weather", "input": {"city": "Paris"}},
					{"id": "call-2", "name": "news", "input": {"city": "Paris"}}
				]},
				{"id": "t-1", "role": "tool", "text": "18°C, clear", "tool_call_id": "call-1"},
				{"id": "t-2", "role": "tool", "text": "outcome unknown after restart", "tool_call_id": "call-2", "is_error": true}
			],
			"tools": [
				{"name": "weather", "description": "Current weather in a city.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
				{"name": "news", "description": "Headlines.", "input_schema": {"type": "object"}}
			]
		}`, string(got.Body))
	})

	t.Run("ResponseParsed", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, reply(200, `{
			"text": "Checking two things.",
			"tool_calls": [
				{"id": "call-3", "name": "weather", "input": {"city": "Lyon"}},
				{"id": "call-4", "name": "news", "input": {}}
			],
			"usage": {"input_tokens": 120, "output_tokens": 17},
			"unknown_future_field": true
		}`))

		resp, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		require.Equal(t, provider.Response{
			Text: "Checking two things.",
			ToolCalls: []provider.ToolCall{
				{ID: "call-3", Name: "weather", Input: []byte(`{"city":"Lyon"}`)},
				{ID: "call-4", Name: "news", Input: []byte(`{}`)},
			},
			Usage: provider.Usage{InputTokens: 120, OutputTokens: 17},
		}, resp)
	})

	t.Run("TextOnlyWithoutUsage", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, reply(200, `{"text":"Hello."}`))

		resp, err := bundle.provider.Complete(context.Background(), sampleRequest())
		require.NoError(t, err)
		require.Equal(t, provider.Response{Text: "Hello."}, resp)
	})

	t.Run("MalformedResponses", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct{ body, wantErr string }{
			"BadJSON":            {`{"text": "unterminated`, "decoding JSON"},
			"NotAnObject":        {`["text"]`, "not a JSON object"},
			"EmptyBody":          {``, "empty body"},
			"WhitespaceBody":     {" \n", "empty body"},
			"NoTextNoToolCalls":  {`{"usage":{"input_tokens":1}}`, `neither "text" nor "tool_calls"`},
			"TextOfWrongType":    {`{"text": 3}`, "decoding JSON"},
			"ToolCallWithoutID":  {`{"tool_calls":[{"name":"x","input":{}}]}`, `"id" is missing`},
			"ToolCallNoName":     {`{"tool_calls":[{"id":"c","input":{}}]}`, `"name" is missing`},
			"ToolCallNoInput":    {`{"tool_calls":[{"id":"c","name":"x"}]}`, `"input" is missing`},
			"ToolCallInputArray": {`{"tool_calls":[{"id":"c","name":"x","input":[1]}]}`, "not a JSON object"},
			"DuplicateCallIDs":   {`{"tool_calls":[{"id":"c","name":"x","input":{}},{"id":"c","name":"y","input":{}}]}`, "used twice"},
			"NegativeUsage":      {`{"text":"","usage":{"input_tokens":-1}}`, "negative"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupHTTP(t, nil, reply(200, tc.body))

				_, err := bundle.provider.Complete(context.Background(), sampleRequest())
				requireClass(t, err, plain)
				require.ErrorContains(t, err, "malformed response")
				require.ErrorContains(t, err, tc.wantErr)
			})
		}
	})

	// A refusal of the request itself is rejected (never retried, not even
	// with idempotency keys); a status that means "later" or a server
	// fault stays plain (retried when keys are honoured).
	t.Run("StatusClasses", func(t *testing.T) {
		t.Parallel()
		for status, want := range map[int]errClass{
			400: rejected, 401: rejected, 403: rejected, 404: rejected, 413: rejected, 422: rejected,
			408: plain, 409: plain, 425: plain, 500: plain, 502: plain, 504: plain,
		} {
			t.Run(strconv.Itoa(status), func(t *testing.T) {
				t.Parallel()
				bundle := setupHTTP(t, &providers.HTTPConfig{HonoursIdempotencyKeys: true}, reply(status, `{"error":"no"}`))

				_, err := bundle.provider.Complete(context.Background(), sampleRequest())
				requireClass(t, err, want)
				require.ErrorContains(t, err, strconv.Itoa(status))
			})
		}
	})

	t.Run("ServerErrorIsPlain", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, reply(500, `{"error":"boom"}`+strings.Repeat("x", 4096)))

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, plain)
		require.ErrorContains(t, err, "500 Internal Server Error")
		require.ErrorContains(t, err, `{\"error\":\"boom\"}`)
		require.Less(t, len(err.Error()), 512+200, "the body excerpt is bounded")
	})

	t.Run("TooManyRequestsRetryAfterSeconds", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "7")
			reply(429, `{"error":"slow down"}`)(w, r, n)
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, retryAfter)
		var ra *provider.RetryAfterError
		require.ErrorAs(t, err, &ra)
		require.Equal(t, 7*time.Second, ra.After)
		require.ErrorContains(t, err, "429")
	})

	t.Run("UnavailableRetryAfterDate", func(t *testing.T) {
		t.Parallel()
		at := time.Now().Add(30 * time.Second).UTC()
		bundle := setupHTTP(t, nil, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", at.Format(http.TimeFormat))
			reply(503, `overloaded`)(w, r, n)
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		var ra *provider.RetryAfterError
		require.ErrorAs(t, err, &ra)
		// The date has whole seconds and time has passed since it was
		// taken.
		require.LessOrEqual(t, ra.After, 30*time.Second)
		require.Greater(t, ra.After, 20*time.Second)
	})

	t.Run("UnavailableWithoutRetryAfter", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, reply(503, ``))

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		var ra *provider.RetryAfterError
		require.ErrorAs(t, err, &ra)
		require.Equal(t, time.Second, ra.After)
	})

	t.Run("RedirectNotFollowed", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
				return
			}
			reply(200, okResponse)(w, r, n)
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, rejected)
		require.ErrorContains(t, err, "307")
		require.Equal(t, 1, bundle.server.count(), "the step was sent once")
	})

	t.Run("ConnectionRefusedIsNotSent", func(t *testing.T) {
		t.Parallel()
		provider := providers.NewHTTP(nil, &providers.HTTPConfig{URL: "http://" + closedAddr(t) + "/step"})

		_, err := provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, notSent)
	})

	t.Run("InvalidConfigIsNotSent", func(t *testing.T) {
		t.Parallel()
		config := &providers.HTTPConfig{URL: "localhost:8080/step"}
		require.ErrorContains(t, config.Validate(), "absolute http or https URL")

		_, err := providers.NewHTTP(nil, config).Complete(context.Background(), sampleRequest())
		requireClass(t, err, notSent)
	})

	t.Run("HangUpAfterReadingIsOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, hangUp(t))

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, outcomeUnknown)
		require.Equal(t, 1, bundle.server.count())
	})

	t.Run("BodyCutOffIsOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, func(w http.ResponseWriter, _ *http.Request, _ int) {
			// Promise more than is sent: the server closes the connection.
			w.Header().Set("Content-Length", "1000")
			_, _ = io.WriteString(w, `{"text": "Sunny`)
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, outcomeUnknown)
		require.ErrorContains(t, err, "reading response")
	})

	// net/http replays a POST with an Idempotency-Key header when a reused
	// connection fails after the request was written. The provider must
	// not let it when the server does not deduplicate (P4).
	t.Run("NoTransportReplayOnReusedConnection", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			honoured     bool
			wantErr      bool
			wantReceived int
		}{
			"KeysNotHonoured": {honoured: false, wantErr: true, wantReceived: 2},
			"KeysHonoured":    {honoured: true, wantErr: false, wantReceived: 3},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupHTTP(t, &providers.HTTPConfig{HonoursIdempotencyKeys: tc.honoured}, func(w http.ResponseWriter, r *http.Request, n int) {
					if n == 2 {
						hangUp(t)(w, r, n)
						return
					}
					reply(200, okResponse)(w, r, n)
				})
				require.Equal(t, tc.honoured, bundle.provider.HonoursIdempotencyKeys())

				// The first step leaves a kept-alive connection that
				// the second reuses.
				_, err := bundle.provider.Complete(context.Background(), sampleRequest())
				require.NoError(t, err)
				_, err = bundle.provider.Complete(context.Background(), sampleRequest())
				if tc.wantErr {
					requireClass(t, err, outcomeUnknown)
				} else {
					require.NoError(t, err)
				}
				require.Equal(t, tc.wantReceived, bundle.server.count())
			})
		}
	})

	t.Run("ContextCancelReturnsPromptly", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		bundle := setupHTTP(t, nil, func(_ http.ResponseWriter, r *http.Request, _ int) {
			close(started)
			<-r.Context().Done()
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()

		done := make(chan error, 1)
		go func() {
			_, err := bundle.provider.Complete(ctx, sampleRequest())
			done <- err
		}()
		<-started
		cancel()
		select {
		case err := <-done:
			requireClass(t, err, outcomeUnknown)
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(5 * time.Second):
			require.FailNow(t, "Complete did not return after its context was cancelled")
		}
	})

	t.Run("TimeoutIsOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, &providers.HTTPConfig{Timeout: 50 * time.Millisecond}, func(_ http.ResponseWriter, r *http.Request, _ int) {
			<-r.Context().Done()
		})

		_, err := bundle.provider.Complete(context.Background(), sampleRequest())
		requireClass(t, err, outcomeUnknown)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("UnencodableTranscriptIsUnsupported", func(t *testing.T) {
		t.Parallel()
		for name, mutate := range map[string]func(*provider.Request){
			"UnknownRole":         func(r *provider.Request) { r.Messages[0].Role = "system" },
			"ToolResultWithoutID": func(r *provider.Request) { r.Messages[2].ToolCallID = "" },
			"SchemaNotAnObject":   func(r *provider.Request) { r.Tools[0].InputSchema = []byte(`"string"`) },
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupHTTP(t, nil, reply(200, okResponse))
				req := sampleRequest()
				mutate(&req)

				_, err := bundle.provider.Complete(context.Background(), req)
				require.ErrorIs(t, err, provider.ErrUnsupported)
				requireClass(t, err, plain)
				require.Equal(t, 0, bundle.server.count())
			})
		}
	})

	// A past call whose input was not a JSON object (the executor stored
	// a model's unstorable input as its text, and the call failed its
	// schema) is sent with input {}: refusing it would fail every later
	// step of the session, for good.
	t.Run("PastCallInputNotAnObjectIsSentEmpty", func(t *testing.T) {
		t.Parallel()
		for name, input := range map[string]string{"Truncated": `{"city":`, "AString": `"{\"n\": 1e1000000}"`, "AnArray": `[1]`} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bundle := setupHTTP(t, nil, reply(200, okResponse))
				req := sampleRequest()
				req.Messages[1].ToolCalls[0].Input = []byte(input)
				_, err := bundle.provider.Complete(context.Background(), req)
				require.NoError(t, err)
				var sent struct {
					Messages []struct {
						ToolCalls []struct {
							Input json.RawMessage `json:"input"`
						} `json:"tool_calls"`
					} `json:"messages"`
				}
				require.NoError(t, json.Unmarshal(bundle.server.next(t).Body, &sent))
				require.JSONEq(t, `{}`, string(sent.Messages[1].ToolCalls[0].Input))
			})
		}
	})

	t.Run("ConfigPrintsNoHeaderValues", func(t *testing.T) {
		t.Parallel()
		config := providers.HTTPConfig{URL: "https://model.internal/step", Headers: map[string]string{"Authorization": "Bearer s3cret"}}
		provider := providers.NewHTTP(nil, &config)
		for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
			for _, v := range []any{config, &config, provider} {
				out := fmt.Sprintf(format, v)
				require.NotContains(t, out, "s3cret", format)
				require.Contains(t, out, "Authorization", format)
			}
		}
	})
}
