package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A replay reading or admitting through a Postgres restart tries again,
// logging each retry, and gives up after retryAttempts tries with an
// error that names the step.
func TestRetriedTriesAgainThenGivesUp(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	down := errors.New("connection refused")

	n := 0
	require.NoError(t, retried(context.Background(), log, "admitting", func() error {
		if n++; n < 3 {
			return down
		}
		return nil
	}))
	require.Equal(t, 3, n)
	require.Equal(t, 2, strings.Count(logs.String(), "admitting failed; retrying"), logs.String())

	n = 0
	err := retried(context.Background(), log, "reading admitted inputs", func() error {
		n++
		return down
	})
	require.ErrorIs(t, err, down)
	require.ErrorContains(t, err, "reading admitted inputs: ")
	require.Equal(t, retryAttempts, n)
}

// A data error of Postgres is the same on every try: retried returns it
// at once, for the caller to reject the prompt (docs/design.md,
// invariant 13).
func TestRetriedReturnsADataErrorAtOnce(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	refused := &pgconn.PgError{Code: "23514", Message: "violates check constraint"}
	n := 0
	err := retried(context.Background(), log, "admitting", func() error {
		n++
		return fmt.Errorf("admitting 3 prompts: %w", refused)
	})
	require.ErrorIs(t, err, refused)
	require.Equal(t, 1, n)
	require.Empty(t, logs.String())
}
