package startstop_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/internal/startstop/startstoptest"
)

// ticker is the smallest service: its loop counts until it is stopped.
type ticker struct {
	loop    startstop.Loop
	started chan struct{}
	ended   chan struct{}
}

func (s *ticker) Start(ctx context.Context) error {
	return s.loop.Start(ctx, func(ctx context.Context) {
		if s.started != nil {
			s.started <- struct{}{}
		}
		<-ctx.Done()
		if s.ended != nil {
			s.ended <- struct{}{}
		}
	})
}

func (s *ticker) Stop() { s.loop.Stop() }

func TestLoop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		startstoptest.Stress(t, &ticker{})
	})

	t.Run("StartReturnsAtOnceAndStopWaitsForTheLoop", func(t *testing.T) {
		s := &ticker{started: make(chan struct{}), ended: make(chan struct{}, 1)}
		require.NoError(t, s.Start(t.Context()))
		<-s.started // the loop runs after Start returned
		s.Stop()
		select {
		case <-s.ended:
		default:
			t.Fatal("Stop returned before the loop did")
		}
	})

	t.Run("TheParentContextEndsTheLoop", func(t *testing.T) {
		s := &ticker{started: make(chan struct{}), ended: make(chan struct{}, 1)}
		ctx, cancel := context.WithCancel(t.Context())
		require.NoError(t, s.Start(ctx))
		<-s.started
		cancel()
		<-s.ended
		s.Stop() // after the loop ended by itself: returns at once
		s.Stop()
	})
}
