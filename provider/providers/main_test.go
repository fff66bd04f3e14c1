package providers_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
)

// No database is used here; testkit.Main is for goleak.
func TestMain(m *testing.M) { testkit.Main(m) }

// received is one request as the fake server saw it.
type received struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// fakeServer is a provider endpoint run by the test.
type fakeServer struct {
	srv      *httptest.Server
	received chan received
}

// startFakeServer starts a server that records every request and then
// lets respond answer it. It is closed when the test ends.
// respond's n counts the requests, from 1.
func startFakeServer(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, n int)) *fakeServer {
	t.Helper()
	fs := &fakeServer{received: make(chan received, 16)}
	var n atomic.Int64
	fs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fs.received <- received{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
		respond(w, r, int(n.Add(1)))
	}))
	t.Cleanup(fs.srv.Close)
	return fs
}

// next returns the next request the server received.
func (fs *fakeServer) next(t *testing.T) received {
	t.Helper()
	select {
	case r := <-fs.received:
		return r
	default:
		require.FailNow(t, "the server received no request")
		return received{}
	}
}

// count drains and counts the requests the server received.
func (fs *fakeServer) count() int {
	n := 0
	for {
		select {
		case <-fs.received:
			n++
		default:
			return n
		}
	}
}

// reply answers with status and body.
func reply(status int, body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// hangUp reads the request (already done by the fake server) and closes
// the connection without answering.
func hangUp(t *testing.T) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijacking: %v", err)
			return
		}
		_ = conn.Close()
	}
}

// closedAddr returns the address of a listener that is already closed:
// dialing it is refused.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// sampleRequest is a step after one tool round: the user asked, the
// assistant called two tools, one answered and one failed.
func sampleRequest() provider.Request {
	user := provider.TranscriptMessage{ID: "m-1", Role: "user", Text: "What is the weather in Paris?"}
	return provider.Request{
		SessionID:          "s-1",
		AssistantMessageID: "a-1",
		AttemptID:          "e-1/2",
		IdempotencyKey:     "e-1/2/key",
		FencingToken:       42,
		Messages: []provider.TranscriptMessage{
			user,
			{ID: "a-1", Role: "assistant", Text: "Let me look.", ToolCalls: []provider.ToolCall{
				{ID: "call-1", Name: "weather", Input: []byte(`{ "city": "Paris" }`)},
				{ID: "call-2", Name: "news", Input: []byte(`{"city":"Paris"}`)},
			}},
			{ID: "t-1", Role: "tool", ToolCallID: "call-1", Text: "18°C, clear"},
			{ID: "t-2", Role: "tool", ToolCallID: "call-2", Text: "outcome unknown after restart", IsError: true},
		},
		Turn: []provider.TranscriptMessage{user},
		Tools: []provider.ToolSpec{
			{Name: "weather", Description: "Current weather in a city.", InputSchema: []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
			{Name: "news", Description: "Headlines."},
		},
	}
}
