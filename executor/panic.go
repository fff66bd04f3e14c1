package executor

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/provider"
)

// A panic in what the executor dispatches to (a tool's Run, a provider's
// Complete) is bad data, not a crash (P6): the model chose the tool's
// input, and a provider's reply is outside data. Unrecovered, it killed
// the process and every session it ran mid-turn, and a panicking
// idempotent tool, run again by recovery, crashed each next owner in
// turn. It is recovered where it was dispatched and becomes an error:
// the call or attempt was dispatched (its intent is committed), so its
// outcome is unknown (P4), recorded as a tool error or a dropped
// connection is, and the turn goes on as after one. A recover writes
// nothing: it opens and closes no crash window.

// panicValueMaxBytes bounds a panic's value as recorded: it goes to the
// ledger, the transcript, the model and the session events.
const panicValueMaxBytes = 512

// panicError is a panic recovered at a dispatch. It wraps nothing: a
// panic's value that is an error (say tools.ErrNotRun) says nothing of
// how far the call got.
type panicError struct {
	what  string // "tool" or "provider"
	value string // redacted and bounded (panicText)
	stack string
}

func (e *panicError) Error() string { return "the " + e.what + " panicked: " + e.value }

// recovered makes the error of a panic recovered with value v (nil for a
// goroutine that ended without returning, runtime.Goexit). It must run in
// the deferred function that recovered, for the stack.
func recovered(what string, v any) *panicError {
	e := &panicError{what: what, value: "runtime.Goexit", stack: string(debug.Stack())}
	if v != nil {
		e.value = panicText(v)
	}
	return e
}

// panicText is a panic's value as text, its secrets masked (redact.Text,
// as for a tool's error) and then cut to panicValueMaxBytes, valid UTF-8.
func panicText(v any) string {
	s := strings.ToValidUTF8(redact.Text(fmt.Sprint(v)), "\uFFFD")
	if len(s) <= panicValueMaxBytes {
		return s
	}
	const mark = "…[truncated]"
	n := panicValueMaxBytes - len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}

// complete is the provider's Complete, a panic in it recovered as an
// error wrapping provider.ErrOutcomeUnknown: the request may have been
// sent, as when the connection drops after sending. Kept small (its
// recovery a deferred method, not a closure): its frame, some 430 bytes,
// is on the stack of every execution waiting on its provider
// (docs/benchmarks.md, "A few bytes of a frame").
func (ex *execution) complete(ctx context.Context, req provider.Request, log *slog.Logger) (resp provider.Response, err error) {
	defer ex.providerPanicked(ctx, req.AttemptID, log, &err)
	return ex.e.cfg.Provider.Complete(ctx, req)
}

// providerPanicked, deferred by complete, recovers a provider's panic,
// logs it with its stack and sets *err to an attempt whose outcome is
// unknown (the response stays zero: Complete never returned). The value
// is logged only when the logger logs debug, as a provider's error is
// (errorAttrs): it may be made of the request.
func (ex *execution) providerPanicked(ctx context.Context, attemptID string, log *slog.Logger, err *error) {
	v := recover()
	if v == nil {
		return
	}
	pe := recovered("provider", v)
	*err = fmt.Errorf("%w: %w", provider.ErrOutcomeUnknown, pe)
	log.ErrorContext(ctx, "provider panicked; the attempt's outcome is unknown", append([]any{slog.String("attempt_id", attemptID)},
		append(ex.errorAttrs(ctx, *err), slog.String("stack", pe.stack))...)...)
}
