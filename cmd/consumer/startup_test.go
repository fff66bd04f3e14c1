package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestStoppedDuringStartup(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	wrapped := fmt.Errorf("connecting to Postgres at u@h/db: %w", context.Canceled)
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		err     error
		running bool
		want    bool
	}{
		{"SignalWhileConnecting", cancelled, wrapped, false, true},
		{"NoError", cancelled, nil, false, false},
		{"NoSignal", live, wrapped, false, false},
		{"AnotherErrorAfterASignal", cancelled, errors.New("--metrics-addr: address already in use"), false, false},
		{"AStatementTimeoutAfterASignal", cancelled, fmt.Errorf("migrating: %w", &pgconn.PgError{Code: "57014"}), false, false},
		{"AfterTheConsumerRan", cancelled, wrapped, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, stoppedDuringStartup(tc.ctx, tc.err, tc.running, slog.New(slog.DiscardHandler)))
		})
	}
}

func TestAwaitStart(t *testing.T) {
	t.Run("ReturnsWhatOpenReturns", func(t *testing.T) {
		var closed atomic.Int32
		v, err := awaitStart(context.Background(), func() (int, error) { return 7, nil }, func(int) { closed.Add(1) })
		require.NoError(t, err)
		require.Equal(t, 7, v)
		require.Zero(t, closed.Load(), "a result handed over is the caller's to close")
		_, err = awaitStart(context.Background(), func() (int, error) { return 0, errors.New("refused") }, nil)
		require.EqualError(t, err, "refused")
	})
	t.Run("TheSignalEndsTheWaitAndTheLateResultIsClosed", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		closed := make(chan int, 1)
		go cancel()
		_, err := awaitStart(ctx, func() (int, error) { <-release; return 9, nil }, func(v int) { closed <- v })
		require.ErrorIs(t, err, context.Canceled)
		close(release) // the abandoned open finishes now
		require.Equal(t, 9, <-closed, "what the abandoned open opened is closed")
	})
	t.Run("ALateErrorClosesNothing", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		finished := make(chan struct{})
		go cancel()
		_, err := awaitStart(ctx, func() (int, error) {
			defer close(finished)
			<-release
			return 0, errors.New("refused")
		}, func(int) { t.Error("closeFn called for a failed open") })
		require.ErrorIs(t, err, context.Canceled)
		close(release)
		<-finished
	})
}
