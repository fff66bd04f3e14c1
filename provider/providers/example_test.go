package providers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/providers"
)

// ExampleHTTP pins the HTTP provider's wire contract: the headers and body
// a model service receives for one step, and how its answer is read.
func ExampleHTTP() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println("POST", r.URL.Path)
		for _, name := range []string{"Content-Type", "Idempotency-Key", "X-Fencing-Token"} {
			fmt.Printf("%s: %s\n", name, r.Header.Get(name))
		}
		var indented bytes.Buffer
		_ = json.Indent(&indented, body, "", "  ")
		fmt.Println(indented.String())

		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text": "Paris: 18°C, clear.", "tool_calls": [], "usage": {"input_tokens": 96, "output_tokens": 9}}`)
	}))
	defer srv.Close()

	p := providers.NewHTTP(srv.Client(), &providers.HTTPConfig{URL: srv.URL + "/v1/step"})
	user := provider.TranscriptMessage{ID: "m-1", Role: "user", Text: "Weather in Paris?"}
	resp, err := p.Complete(context.Background(), provider.Request{
		SessionID:          "s-1",
		AssistantMessageID: "a-1",
		AttemptID:          "e-1/2",
		IdempotencyKey:     "e-1/2/key",
		FencingToken:       7,
		Messages: []provider.TranscriptMessage{
			user,
			{ID: "a-1", Role: "assistant", ToolCalls: []provider.ToolCall{{ID: "call-1", Name: "weather", Input: json.RawMessage(`{"city": "Paris"}`)}}},
			{ID: "t-1", Role: "tool", ToolCallID: "call-1", Text: "18°C, clear"},
		},
		Turn:  []provider.TranscriptMessage{user},
		Tools: []provider.ToolSpec{{Name: "weather", Description: "Current weather in a city.", InputSchema: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}}`)}},
	})
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Printf("text %q, %d tool calls, usage %+v\n", resp.Text, len(resp.ToolCalls), resp.Usage)

	// Output:
	// POST /v1/step
	// Content-Type: application/json
	// Idempotency-Key: e-1/2/key
	// X-Fencing-Token: 7
	// {
	//   "session_id": "s-1",
	//   "assistant_message_id": "a-1",
	//   "attempt_id": "e-1/2",
	//   "turn_message_ids": [
	//     "m-1"
	//   ],
	//   "messages": [
	//     {
	//       "id": "m-1",
	//       "role": "user",
	//       "text": "Weather in Paris?"
	//     },
	//     {
	//       "id": "a-1",
	//       "role": "assistant",
	//       "text": "",
	//       "tool_calls": [
	//         {
	//           "id": "call-1",
	//           "name": "weather",
	//           "input": {
	//             "city": "Paris"
	//           }
	//         }
	//       ]
	//     },
	//     {
	//       "id": "t-1",
	//       "role": "tool",
	//       "text": "18°C, clear",
	//       "tool_call_id": "call-1"
	//     }
	//   ],
	//   "tools": [
	//     {
	//       "name": "weather",
	//       "description": "Current weather in a city.",
	//       "input_schema": {
	//         "type": "object",
	//         "properties": {
	//           "city": {
	//             "type": "string"
	//           }
	//         }
	//       }
	//     }
	//   ]
	// }
	// text "Paris: 18°C, clear.", 0 tool calls, usage {InputTokens:96 OutputTokens:9}
}
