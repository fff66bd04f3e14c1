package executor

import (
	"context"
	"errors"
	"log/slog"

	"github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/provider"
)

// logTurnFailed logs a failed turn (errorAttrs says what of the cause).
func (ex *execution) logTurnFailed(ctx context.Context, t *turn, reason string, cause error) {
	attrs := []any{slog.String("session_id", ex.sessionID), slog.String("turn_id", t.id), slog.String("reason", reason)}
	ex.e.log.WarnContext(ctx, "turn failed", append(attrs, ex.errorAttrs(ctx, cause)...)...)
}

// errorAttrs describes a provider's error for a log line. Logs carry IDs,
// never prompt text, and a provider's error is often made of the request
// (the scripted provider's /fail is the prompt; real providers' 4xx bodies
// echo the input): so the line names the error's class and HTTP status,
// and its text only when the logger logs debug. The text is stored and
// published with the turn (turn.failed), not logged at the default level.
func (ex *execution) errorAttrs(ctx context.Context, err error) []any {
	attrs := []any{slog.String("error_class", errorClass(err))}
	var se *provider.StatusError
	if errors.As(err, &se) {
		attrs = append(attrs, slog.Int("status", se.Code))
	}
	if ex.e.log.Enabled(ctx, slog.LevelDebug) {
		attrs = append(attrs, slog.Any("error", redact.Error(err)))
	}
	return attrs
}

// errorClass names what kind of failure err is, without its text.
func errorClass(err error) string {
	var ra *provider.RetryAfterError
	var se *provider.StatusError
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, errDeclined):
		return "declined"
	case errors.Is(err, provider.ErrUnsupported):
		return "unsupported"
	case errors.Is(err, provider.ErrRejected):
		return "rejected"
	case errors.As(err, &ra):
		return "retry_after"
	case errors.Is(err, provider.ErrNotSent):
		return "not_sent"
	case errors.Is(err, provider.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.As(err, &se):
		return "status"
	}
	return "error"
}
