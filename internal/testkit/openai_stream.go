package testkit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// OpenAIStreamConfig is the answer an OpenAIStreamHandler streams.
type OpenAIStreamConfig struct {
	// Fragments are the content deltas, one chunk each.
	Fragments []string
	// Gap is the pause after each chunk (the model "thinking"). Defaults
	// to none.
	Gap time.Duration
	// InputTokens and OutputTokens are reported in the usage chunk.
	InputTokens, OutputTokens int64
}

// OpenAIStreamHandler answers every POST as an OpenAI-compatible server
// with stream: true does: server-sent events, one chunk per fragment
// (flushed as written), a finish chunk, a usage chunk, then [DONE].
func OpenAIStreamHandler(cfg OpenAIStreamConfig) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		flusher, _ := w.(http.Flusher)
		send := func(v any) bool {
			b, _ := json.Marshal(v)
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return false
			}
			if flusher != nil {
				flusher.Flush()
			}
			return true
		}
		for _, f := range cfg.Fragments {
			if !send(map[string]any{"object": "chat.completion.chunk", "choices": []any{
				map[string]any{"index": 0, "delta": map[string]any{"content": f}, "finish_reason": nil}}}) {
				return
			}
			if cfg.Gap > 0 {
				select {
				case <-time.After(cfg.Gap):
				case <-r.Context().Done():
					return
				}
			}
		}
		send(map[string]any{"object": "chat.completion.chunk", "choices": []any{
			map[string]any{"index": 0, "delta": map[string]any{}, "finish_reason": "stop"}}})
		send(map[string]any{"object": "chat.completion.chunk", "choices": []any{},
			"usage": map[string]any{"prompt_tokens": cfg.InputTokens, "completion_tokens": cfg.OutputTokens}})
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	}
}
