package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/retry"
)

var errAgain = errors.New("again")

func TestDoRetriesUntilTheStepSucceeds(t *testing.T) {
	t.Parallel()
	var waits []time.Duration
	var tries []int
	n := 0
	err := retry.Do(context.Background(), retry.Policy{
		Min: time.Millisecond, Max: 4 * time.Millisecond,
		OnRetry: func(try int, err error, wait time.Duration) {
			require.ErrorIs(t, err, errAgain)
			tries = append(tries, try)
			waits = append(waits, wait)
		},
	}, func() error {
		if n++; n < 6 {
			return errAgain
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 6, n)
	require.Equal(t, []int{1, 2, 3, 4, 5}, tries)
	// Doubling from Min, capped at Max, each within ±50%.
	for i, want := range []time.Duration{1, 2, 4, 4, 4} {
		want *= time.Millisecond
		require.GreaterOrEqual(t, waits[i], want/2, "wait %d: %v", i, waits)
		require.LessOrEqual(t, waits[i], want*3/2, "wait %d: %v", i, waits)
	}
}

func TestDoStopsAtAFinalError(t *testing.T) {
	t.Parallel()
	final := errors.New("final")
	n := 0
	err := retry.Do(context.Background(), retry.Policy{
		Min: time.Millisecond, Max: time.Millisecond,
		Final: func(err error) bool { return errors.Is(err, final) },
	}, func() error {
		if n++; n < 3 {
			return errAgain
		}
		return final
	})
	require.Same(t, final, err)
	require.Equal(t, 3, n)
}

func TestDoStopsAfterItsTries(t *testing.T) {
	t.Parallel()
	n := 0
	retried := 0
	err := retry.Do(context.Background(), retry.Policy{
		Min: time.Microsecond, Max: time.Microsecond, Tries: 4,
		OnRetry: func(int, error, time.Duration) { retried++ },
	}, func() error {
		n++
		return errAgain
	})
	require.Same(t, errAgain, err)
	require.Equal(t, 4, n)
	require.Equal(t, 3, retried)
}

func TestDoReturnsTheStepsErrorWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	n, retried := 0, 0
	done := make(chan error, 1)
	go func() {
		// Waits of an hour: also beyond the library's default limit of
		// 15 minutes of retrying, which would return at once, without
		// calling OnRetry. The policy has no time limit.
		done <- retry.Do(ctx, retry.Policy{
			Min: time.Hour, Max: time.Hour,
			OnRetry: func(int, error, time.Duration) { retried++; cancel() },
		}, func() error {
			n++
			return errAgain
		})
	}()
	select {
	case err := <-done:
		require.Same(t, errAgain, err, "the step's error, not the context's")
		require.Equal(t, 1, n)
		require.Equal(t, 1, retried, "an hour's wait must be waited for (no time limit), until ctx ends")
	case <-time.After(10 * time.Second):
		t.Fatal("Do waited out its hour after the context ended")
	}

	// A context that has already ended: one try, no wait.
	n = 0
	err := retry.Do(ctx, retry.Policy{Min: time.Hour, Max: time.Hour}, func() error {
		n++
		return errAgain
	})
	require.Same(t, errAgain, err)
	require.Equal(t, 1, n)
}
