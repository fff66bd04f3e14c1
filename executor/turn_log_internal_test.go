package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
)

// The class a log line gives a failure names its kind, never its text,
// wrapped or not; no failure is "none".
func TestErrorClass(t *testing.T) {
	t.Parallel()
	for want, err := range map[string]error{
		"none":              nil,
		"canceled":          context.Canceled,
		"deadline_exceeded": context.DeadlineExceeded,
		"declined":          errDeclined,
		"unsupported":       provider.ErrUnsupported,
		"rejected":          provider.ErrRejected,
		"retry_after":       &provider.RetryAfterError{Err: errors.New("slow down")},
		"not_sent":          provider.ErrNotSent,
		"outcome_unknown":   provider.ErrOutcomeUnknown,
		"status":            &provider.StatusError{Code: 500, Err: errors.New("boom")},
		"error":             errors.New("anything else"),
	} {
		require.Equal(t, want, errorClass(err), "%v", err)
		if err != nil {
			require.Equal(t, want, errorClass(fmt.Errorf("step 2: %w", err)), "wrapped %v", err)
		}
	}
}
