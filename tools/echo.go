package tools

import (
	"context"
	"encoding/json"
)

const echoSchema = `{
  "type": "object",
  "properties": {
    "text": {"type": "string", "description": "The text to return."}
  },
  "required": ["text"],
  "additionalProperties": false
}`

type echo struct{}

// NewEcho returns the echo tool, for demos and tests. Name "echo", class
// Idempotent (it has no effect). Input {"text": string}, required, no other
// properties; output the text.
func NewEcho() Tool { return echo{} }

func (echo) Spec() Spec {
	return Spec{
		Name:        "echo",
		Description: "Returns the given text unchanged.",
		InputSchema: json.RawMessage(echoSchema),
		Class:       Idempotent,
	}
}

func (echo) Run(_ context.Context, call Call) (Result, error) {
	var in struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(call.Input, &in); err != nil || in.Text == nil {
		return Result{IsError: true, Output: `invalid input: want {"text": string}`}, nil
	}
	return Result{Output: *in.Text}, nil
}
