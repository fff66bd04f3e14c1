package tools

import (
	"context"
	"encoding/json"
	"errors"
)

// ErrNotRun is wrapped by an error from Tool.Run when the tool knows that no
// side effect started (for example, the connection was refused before any
// byte was sent). Without it, an error from Run means the outcome is unclear.
var ErrNotRun = errors.New("tool did not run")

// Spec is what a tool declares: what the model sees, and how promptline
// treats the call after a crash.
type Spec struct {
	// Name is how the model calls the tool; it must match
	// ^[a-zA-Z0-9_-]{1,64}$ (the rule of OpenAI function names).
	Name string
	// Description tells the model what the tool does and when to use it.
	Description string
	// InputSchema is the JSON Schema (draft 2020-12 unless it says
	// otherwise with $schema) of the call's input. It must describe a JSON
	// object ("type": "object"), as the model APIs require, and may not
	// reference other documents.
	InputSchema json.RawMessage
	// Class says whether the call may be run again when its outcome is
	// unknown. A tool that implements ClassResolver may refine it per input;
	// Class is then the fallback.
	Class Class
}

// Call is one invocation of a tool, as committed to the ledger before Run.
type Call struct {
	// ID is the model's ID of the tool call.
	ID string
	// Name is the tool's name.
	Name string
	// Input is the call's input, already validated against the schema
	// when the executor calls Run.
	Input json.RawMessage
	// SessionID is the session the call belongs to.
	SessionID string
	// IdempotencyKey is the same on every run of the same call: a tool
	// that reaches another system passes it on so that a re-run of an
	// Idempotent call has no second effect.
	IdempotencyKey string
	// FencingToken is the token of the execution's claim on the session.
	// It only grows; a tool that reaches another system passes it on so
	// that the system can refuse a call from a superseded execution.
	FencingToken int64
}

// Result is the outcome of a call that the tool is sure of.
type Result struct {
	// Output goes back to the model.
	Output string
	// IsError: the tool ran (or refused to) and failed cleanly; the output
	// says why and goes back to the model.
	IsError bool
}

// Tool is a function the model may call.
type Tool interface {
	// Spec describes the tool. The Registry reads it once, in Register.
	Spec() Spec
	// Run performs the call. A Result (with IsError or not) is an outcome
	// the tool is sure of. An error means the tool could not run or does
	// not know the outcome; wrap ErrNotRun when no side effect started.
	// A panic in Run is taken as an error of the second kind: the call's
	// outcome is unknown. Run must honour ctx and be safe for concurrent
	// use.
	Run(ctx context.Context, call Call) (Result, error)
}
