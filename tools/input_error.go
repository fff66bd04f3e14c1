package tools

import "fmt"

// InputError is a call whose input does not fit: an unknown tool, input that
// is not JSON, or input that does not match the tool's schema. It is a
// failed call to return to the model (which may correct itself), not a
// crash; the tool never ran.
type InputError struct {
	// Tool is the name the model called.
	Tool string
	// Reason says what is wrong, at most 1 KiB.
	Reason string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("invalid call of tool %q: %s", e.Tool, e.Reason)
}
