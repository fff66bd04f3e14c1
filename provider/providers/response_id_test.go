package providers_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
)

// ids collects the response IDs a provider reports.
type ids struct {
	mu  sync.Mutex
	got []string
	one chan struct{} // closed at the first
}

func newIDs() *ids { return &ids{one: make(chan struct{})} }

func (i *ids) add(id string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if len(i.got) == 0 {
		close(i.one)
	}
	i.got = append(i.got, id)
}

func (i *ids) all() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]string(nil), i.got...)
}

func TestResponseID(t *testing.T) {
	t.Parallel()

	t.Run("HTTPReportsTheRequestIDHeaderBeforeTheBody", func(t *testing.T) {
		t.Parallel()
		got := newIDs()
		bundle := setupHTTP(t, nil, func(w http.ResponseWriter, _ *http.Request, _ int) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Request-Id", "req-7")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			// The body only once the ID was reported: it came with the
			// headers, before the answer.
			select {
			case <-got.one:
			case <-time.After(10 * time.Second):
			}
			_, _ = io.WriteString(w, okResponse)
		})
		req := sampleRequest()
		req.ResponseIDFunc = got.add
		resp, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)
		require.Equal(t, "Sunny.", resp.Text)
		require.Equal(t, []string{"req-7"}, got.all())
	})

	t.Run("HTTPWithoutAHeaderReportsNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setupHTTP(t, nil, reply(200, okResponse))
		got := newIDs()
		req := sampleRequest()
		req.ResponseIDFunc = got.add
		_, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)
		require.Empty(t, got.all())
	})

	t.Run("OpenAIStreamReportsTheHeaderThenTheChunkID", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Request-Id", "req-9")
			_, _ = io.WriteString(w, "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"+
				"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		})
		got := newIDs()
		req := sampleRequest()
		req.ResponseIDFunc = got.add
		resp, err := bundle.provider.Complete(context.Background(), req)
		require.NoError(t, err)
		require.Equal(t, "Hi", resp.Text)
		require.Equal(t, []string{"req-9", "chatcmpl-1", "chatcmpl-1"}, got.all(), "the executor keeps the first")
	})

	t.Run("OpenAINamesItsModel", func(t *testing.T) {
		t.Parallel()
		bundle := setupOpenAIStream(t, sse(""))
		var p provider.Provider = bundle.provider
		namer, ok := p.(provider.ModelNamer)
		require.True(t, ok)
		require.Equal(t, bundle.config.Model, namer.ModelName())
		require.NotEmpty(t, namer.ModelName())
	})
}
