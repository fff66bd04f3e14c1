package replay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

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
