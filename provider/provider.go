package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Provider produces the assistant's side of one provider step. Providers
// must honour ctx: a cancelled step returns promptly.
//
// Before Complete is called, the executor has committed the attempt's intent
// (and the claim's phase "unknown"); after it returns, the executor commits
// the response before acting on it. A provider reports failures with these
// classes, because they decide what may be retried:
//   - an error wrapping ErrNotSent: the request certainly did not reach the
//     provider (e.g. connection refused); retried with bounded backoff;
//   - a *RetryAfterError: the provider refused the request without acting
//     on it (HTTP 429 or 503 with Retry-After); retried after the delay,
//     durably;
//   - an error wrapping ErrOutcomeUnknown: the request may have reached the
//     provider and no answer came (connection dropped after sending,
//     timeout); the attempt is recorded unknown and the turn fails with
//     reason outcome_unknown, unless the provider honours idempotency keys
//     (IdempotentProvider): then it is retried with the same key;
//   - an error wrapping ErrRejected: the provider answered that it will not
//     serve the request as sent (HTTP 4xx such as 400, 401, 403, 404, 422);
//     the attempt is recorded failed and never retried: the same request
//     would be refused again;
//   - anything else: the provider answered with a failure; the attempt is
//     recorded failed; retried only when the provider honours idempotency
//     keys, with the same key.
//
// A panic in Complete (in its own goroutine: not in one it starts) is
// recovered by the executor and taken as an error wrapping
// ErrOutcomeUnknown.
type Provider interface {
	Complete(ctx context.Context, req Request) (Response, error)
}

// IdempotentProvider is implemented by providers that may declare that the
// remote side deduplicates requests by Request.IdempotencyKey.
type IdempotentProvider interface {
	HonoursIdempotencyKeys() bool
}

// ModelNamer is implemented by providers that name the model they ask:
// the executor records it with each attempt's intent.
type ModelNamer interface {
	ModelName() string
}

// Request is one provider step of a turn.
type Request struct {
	SessionID          string
	AssistantMessageID string
	// AttemptID is derived from the execution and the step number.
	AttemptID string
	// IdempotencyKey is stable across retries of this step (HTTP header
	// Idempotency-Key).
	IdempotencyKey string
	// FencingToken lets the receiving side refuse a stale writer (HTTP
	// header X-Fencing-Token).
	FencingToken int64
	// Messages is the session's transcript, oldest first, ending with this
	// step's input (the turn's user messages, or settled tool results).
	// Every tool call in it has a result: unsettled calls are represented
	// as error results ("interrupted", "outcome unknown").
	Messages []TranscriptMessage
	// Turn lists the user messages this turn answers.
	Turn []TranscriptMessage
	// Tools the model may call. Shared between requests: read-only.
	Tools []ToolSpec
	// TextDeltaFunc, when set, takes the answer's text as a streaming
	// provider receives it, fragment by fragment, in order, from
	// Complete's goroutine; it never blocks. The fragments are for
	// display only (live deltas): Response.Text stays the answer.
	// A provider that does not stream ignores it. Nil when the process
	// publishes no deltas.
	TextDeltaFunc func(text string) `json:"-"`
	// ResponseIDFunc, when set, takes the provider's response or request
	// ID (an X-Request-Id header, the id of a stream's first chunk) as
	// soon as the first bytes of the answer carry it, from Complete's
	// goroutine, before Complete returns; it never blocks. The executor
	// records it, best effort, while the attempt is still in flight: what
	// an operator needs to ask the provider about an attempt that ends
	// unknown. Only its first non-empty ID counts.
	ResponseIDFunc func(id string) `json:"-"`
}

// TranscriptMessage is one message as a provider sees it.
type TranscriptMessage struct {
	ID   string
	Role string // "user", "assistant" or "tool"
	Text string
	// ToolCalls requested by an assistant message.
	ToolCalls []ToolCall
	// ToolCallID: for role "tool", the call this message is the result of.
	ToolCallID string
	// IsError: for role "tool", the call failed (or its outcome is unknown).
	IsError bool
}

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	Name        string
	Description string
	InputSchema json.RawMessage
}

// ToolCall is a call the model requested.
type ToolCall struct {
	ID    string
	Name  string
	Input json.RawMessage
}

// Response is the answer of one provider step: text, tool calls,
// or both.
type Response struct {
	Text      string
	ToolCalls []ToolCall
	Usage     Usage
	// ResponseID is the provider's ID of the response, if it gave one:
	// recorded with the outcome unless ResponseIDFunc's was recorded.
	ResponseID string
}

// Usage counts tokens as the provider reports them.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
}

var (
	// ErrUnsupported marks a request the provider cannot serve; the turn
	// fails with reason "unsupported".
	ErrUnsupported = errors.New("unsupported")
	// ErrNotSent marks a failure that certainly happened before the
	// request reached the provider.
	ErrNotSent = errors.New("request not sent")
	// ErrOutcomeUnknown marks a failure after the request may have reached
	// the provider, without an answer (connection dropped, timeout): the
	// attempt is recorded unknown and not retried, unless the provider
	// honours idempotency keys.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrRejected marks a failure the provider answered with a refusal of
	// the request itself (bad request, bad credentials, unknown model):
	// sending the same request again cannot succeed, so it is not retried,
	// not even by a provider that honours idempotency keys. The turn fails
	// with reason "provider_error".
	ErrRejected = errors.New("request rejected")
)

// RetryAfterError says the provider refused the request without acting on
// it and may accept it after After.
type RetryAfterError struct {
	After time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.After, e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// StatusError is a provider's answer with a non-2xx HTTP status. Its text
// (Err) holds an excerpt of the answer's body, which often echoes the
// request, prompt text included: logs at the default level name only the
// Code (see the executor's logTurnFailed).
type StatusError struct {
	Code int
	Err  error
}

func (e *StatusError) Error() string { return e.Err.Error() }

func (e *StatusError) Unwrap() error { return e.Err }
