package executor

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A refused write is tried again, refusedTries times in all; an error
// that may have come after the commit is never tried again.
func TestRetryRefusedBounds(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	deadlock := &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}

	n := 0
	began := time.Now()
	err := retryRefused(context.Background(), log, "claim", func() error {
		n++
		return deadlock
	})
	took := time.Since(began)
	require.ErrorIs(t, err, deadlock)
	require.Equal(t, refusedTries, n)
	// The tries are spaced as documented: each wait at least half its
	// backoff, doubled from 20 ms up to a second (a timer never fires
	// early, so the bound holds on any machine).
	var least time.Duration
	for i, b := 0, 20*time.Millisecond; i < refusedTries-1; i, b = i+1, min(2*b, time.Second) {
		least += b / 2
	}
	require.GreaterOrEqual(t, took, least, "the refused tries were spaced by the backoff")
	require.Equal(t, refusedTries-1, strings.Count(logs.String(), "claim refused by the database; trying again"), logs.String())

	n = 0
	inDoubt := errors.New("connection reset during COMMIT")
	err = retryRefused(context.Background(), log, "claim", func() error {
		if n++; n == 1 {
			return deadlock
		}
		return inDoubt
	})
	require.ErrorIs(t, err, inDoubt)
	require.Equal(t, 2, n, "an error that may have committed ends the retry")

	n = 0
	require.NoError(t, retryRefused(context.Background(), log, "claim", func() error {
		if n++; n < 3 {
			return deadlock
		}
		return nil
	}))
	require.Equal(t, 3, n)
}
