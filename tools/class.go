package tools

import (
	"encoding/json"
	"fmt"
)

// Class says whether promptline may run a call again when its outcome is
// unknown after a crash.
type Class string

const (
	// Idempotent: safe to run again with the same idempotency key. After a
	// crash between intent and result promptline may re-run the call with
	// the same Call.IdempotencyKey.
	Idempotent Class = "idempotent"
	// SideEffecting: never re-run automatically when its outcome is unknown.
	// After a crash between intent and result the call is recorded unknown.
	SideEffecting Class = "side_effecting"
)

// ParseClass parses the string form of a Class, as stored in the ledger.
func ParseClass(s string) (Class, error) {
	switch c := Class(s); c {
	case Idempotent, SideEffecting:
		return c, nil
	}
	return "", fmt.Errorf("unknown tool class %q (want %q or %q)", s, Idempotent, SideEffecting)
}

func (c Class) valid() bool { return c == Idempotent || c == SideEffecting }

// ClassResolver is implemented by tools whose class depends on the input,
// such as http_request, whose class is that of the endpoint called. The
// executor checks for it (ResolveClass does) before committing an intent.
// ClassOf must return SideEffecting for an input it cannot resolve.
type ClassResolver interface {
	ClassOf(input json.RawMessage) Class
}

// ResolveClass returns the class of a call of t with the given input: the
// tool's ClassOf when it implements ClassResolver, else Spec().Class. Any
// value that is not a known Class resolves to SideEffecting, the class that
// never repeats an effect.
func ResolveClass(t Tool, input json.RawMessage) Class {
	if r, ok := t.(ClassResolver); ok {
		if c := r.ClassOf(input); c.valid() {
			return c
		}
		return SideEffecting
	}
	if c := t.Spec().Class; c.valid() {
		return c
	}
	return SideEffecting
}
