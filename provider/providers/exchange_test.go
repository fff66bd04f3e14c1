package providers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for value, want := range map[string]time.Duration{
		"":                               time.Second,
		"7":                              7 * time.Second,
		" 7 ":                            7 * time.Second,
		"0":                              0,
		"-3":                             time.Second,
		"1.5":                            time.Second,
		"soon":                           time.Second,
		"301":                            5 * time.Minute,
		"99999999999999999999":           time.Second, // overflows int64: unreadable
		"9223372036854775807":            5 * time.Minute,
		"Sun, 01 Mar 2026 12:00:30 GMT":  30 * time.Second,
		"Sunday, 01-Mar-26 12:00:30 GMT": 30 * time.Second, // RFC 850
		"Sun Mar  1 12:00:30 2026":       30 * time.Second, // asctime
		"Sun, 01 Mar 2026 11:00:00 GMT":  0,                // in the past
		"Mon, 02 Mar 2026 12:00:00 GMT":  5 * time.Minute,
	} {
		require.Equal(t, want, parseRetryAfter(value, now), "Retry-After %q", value)
	}
}

func TestNotSent(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"Dial":              {&url.Error{Op: "Post", URL: "http://x", Err: dial}, true},
		"ProxyDial":         {&url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "proxyconnect", Err: dial}}, true},
		"ProxyRefusedAfter": {&url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "proxyconnect", Err: errors.New("502 Bad Gateway")}}, false},
		"ResetOnRead":       {&url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "read", Err: syscall.ECONNRESET}}, false},
		"ResetOnWrite":      {&url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "write", Err: syscall.EPIPE}}, false},
		"EOF":               {&url.Error{Op: "Post", URL: "http://x", Err: errors.New("EOF")}, false},
		"Wrapped":           {fmt.Errorf("step: %w", &url.Error{Op: "Post", URL: "http://x", Err: dial}), true},
	} {
		require.Equal(t, tc.want, notSent(tc.err), name)
	}
}

func TestReadExcerpt(t *testing.T) {
	t.Parallel()
	const secret = "sk-0123456789"
	for name, tc := range map[string]struct {
		body string
		want string
	}{
		"Short":          {"bad request", "bad request"},
		"Bounded":        {strings.Repeat("a", 2000), strings.Repeat("a", excerptMax)},
		"SecretInside":   {"key " + secret + " is wrong", "key " + redacted + " is wrong"},
		"SecretAtBound":  {strings.Repeat("a", excerptMax-3) + secret, strings.Repeat("a", excerptMax-3)},
		"SecretPastRead": {strings.Repeat("a", excerptMax+5) + secret, strings.Repeat("a", excerptMax)},
	} {
		got := readExcerpt(strings.NewReader(tc.body), secret)
		require.Equal(t, tc.want, got, name)
		require.LessOrEqual(t, len(got), excerptMax, name)
		require.NotContains(t, got, secret[:4], name)
	}
}

// The decoders read outside input: they must never panic, and what they
// accept must keep the promises the executor relies on.
func FuzzDecodeHTTPResponse(f *testing.F) {
	for _, seed := range []string{
		`{"text":"hi","tool_calls":[{"id":"c","name":"n","input":{"a":1}}],"usage":{"input_tokens":1,"output_tokens":2}}`,
		`{"text":null,"tool_calls":null}`,
		`{"tool_calls":[{"id":"c","name":"n","input":"{}"}]}`,
		`{"text":"x"} trailing`,
		`[]`, ``, `{`, `{"usage":{"input_tokens":1e400}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp, err := decodeHTTPResponse(raw)
		if err != nil {
			return
		}
		checkDecoded(t, resp.ToolCalls)
	})
}

func FuzzDecodeOpenAIResponse(f *testing.F) {
	for _, seed := range []string{
		`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		`{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"n","arguments":"{\"a\":1}"}}]}}]}`,
		`{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"n","arguments":"{"}}]}}]}`,
		`{"choices":[{"message":null}]}`,
		`{"error":{"message":"x","code":429}}`,
		`{"choices":[{"message":{"refusal":"no"}}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp, err := decodeOpenAIResponse(raw)
		if err != nil {
			return
		}
		checkDecoded(t, resp.ToolCalls)
	})
}

func checkDecoded(t *testing.T, calls []provider.ToolCall) {
	seen := map[string]bool{}
	for _, c := range calls {
		require.NotEmpty(t, c.ID)
		require.NotEmpty(t, c.Name)
		require.False(t, seen[c.ID], "duplicate id %q", c.ID)
		seen[c.ID] = true
		var obj map[string]any
		require.NoError(t, json.Unmarshal(c.Input, &obj), "input %q", c.Input)
		require.NotNil(t, obj)
	}
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestExchangeGivesTransportsNoWayToResend: net/http's transports resend a
// written request only by rewinding its body (Request.GetBody): HTTP/2
// after a stream reset with PROTOCOL_ERROR, for any method. A step may
// be resent only under a key the provider honours.
func TestExchangeGivesTransportsNoWayToResend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		key      string
		honoured bool
		rewinds  bool
	}{
		{"KeyNotHonoured", "k-1", false, false},
		{"NoKey", "", true, false},
		{"KeyHonoured", "k-1", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rewinds bool
			client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				rewinds = r.GetBody != nil
				return &http.Response{StatusCode: 200, Status: "200 OK", Header: http.Header{},
					Body: io.NopCloser(strings.NewReader(`{"text":"ok"}`)), Request: r}, nil
			})}
			_, err := exchange(t.Context(), client, exchangeOpts{URL: "https://model.test/v1", Body: []byte(`{}`),
				IdempotencyKey: tc.key, HonoursIdempotencyKeys: tc.honoured})
			require.NoError(t, err)
			require.Equal(t, tc.rewinds, rewinds)
		})
	}
}
