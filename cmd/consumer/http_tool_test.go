package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// The http_request tool, configured with --http-tool-endpoint: the model
// names an endpoint, the call reaches it once with the idempotency key and
// the fencing token, and its answer goes back to the model.
func TestHTTPToolEndpoint(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []*http.Request
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, bodies = append(got, r), append(bodies, string(b))
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)

	b := setup(t)
	b.start(t, "consumer", "", "--http-tool-endpoint", "name=notify,url="+srv.URL+"/hook,class=side_effecting")
	p := prompt("s-http-tool", `/tool http_request {"endpoint": "notify", "body": {"x": 1}}`)
	b.send(t, p)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, `tool results: http_request: {"ok":true}`, turn.Text)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1, "one request, never repeated")
	require.Equal(t, "/hook", got[0].URL.Path)
	require.Equal(t, http.MethodPost, got[0].Method)
	require.JSONEq(t, `{"x": 1}`, bodies[0])
	require.NotEmpty(t, got[0].Header.Get("Idempotency-Key"))
	require.Equal(t, "1", got[0].Header.Get("X-Fencing-Token"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE tool = 'http_request' AND class = 'side_effecting' AND state = 'succeeded'`))
}

func TestHTTPToolEndpointFlag(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"name=x", "url=http://127.0.0.1:1/", "name=x,url=http://127.0.0.1:1/,class=sometimes", "name=x,url=http://127.0.0.1:1/,colour=red"} {
		_, stderr, code := runOnce(t, "--http-tool-endpoint", v, "--database-url", "postgres://127.0.0.1:1/none", "--brokers", "127.0.0.1:1")
		require.Equal(t, 1, code, v)
		require.Contains(t, stderr, "--http-tool-endpoint", v)
	}
	// A refused endpoint names the flag, never its URL's secrets.
	for _, v := range []string{
		"name=x,url=https://u:hunter2@h.internal/x?token=t0ken,class=sometimes",
		"name=x,url=ftp://u:hunter2@h.internal/x?token=t0ken",
		"name=x,url=https://u:hunter2@h.internal/x?token=t0ken,colour=red",
		"name=x,url=https://u:hu/nter2@h.internal/x?token=t0ken",
		"name=bad name,url=https://u:hunter2@h.internal/x?token=t0ken",
	} {
		_, stderr, code := runOnce(t, "--http-tool-endpoint", v, "--database-url", "postgres://127.0.0.1:1/none", "--brokers", "127.0.0.1:1")
		require.Equal(t, 1, code, v)
		require.Contains(t, stderr, "--http-tool-endpoint", v)
		for _, secret := range []string{"hunter2", "nter2", "t0ken"} {
			require.NotContains(t, stderr, secret, v)
		}
	}
}
