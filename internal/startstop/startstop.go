// Package startstop holds the lifecycle contract of promptline's background
// services (the outbox relay, the recoverer, the pruners, the broker watch):
//
//   - Start(ctx) returns at once, the service running in a goroutine of its
//     own until ctx ends or Stop is called; it fails with ErrStarted while
//     the service runs.
//   - Stop ends the service and returns once it has ended. It may be called
//     before Start, twice, and from several goroutines at once.
//   - A stopped service (by Stop, or because its ctx ended) may be started
//     again.
//
// It is modelled on River's rivershared/startstop, written here because
// that package lives in a module that brings River in, and because these
// services need only its core: one loop per service, no Started channel.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// ErrStarted is returned by Start while the service runs.
var ErrStarted = errors.New("already started")

// Loop runs one service's loop under the contract above. A service keeps a
// Loop in a field and implements its Start and Stop with it, so that each
// documents what its own stop does (the relay's last pass, say). The zero
// Loop is ready for use; it must not be copied after first use. run, and
// what it calls, must not call the Loop's Start or Stop: Stop holds the
// Loop while it waits for run to return.
type Loop struct {
	// mu is held across a whole Stop, so that a Start racing with it
	// waits for the loop to end instead of seeing it half stopped.
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs run(ctx) in a goroutine and returns at once; the ctx run gets
// ends with ctx or at Stop. It returns ErrStarted while an earlier run has
// not returned.
func (l *Loop) Start(ctx context.Context, run func(ctx context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.running() {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	l.cancel, l.done = cancel, done
	go func() {
		defer close(done)
		defer cancel()
		run(ctx)
	}()
	return nil
}

// Stop cancels run's ctx and waits for run to return. It returns at once
// when the loop was never started or has already stopped.
func (l *Loop) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		return
	}
	l.cancel()
	<-l.done
	l.cancel, l.done = nil, nil
}

// running reports whether a run has started and not returned; a run that
// ended on its own (its ctx ended) counts as stopped. l.mu is held.
func (l *Loop) running() bool {
	if l.done == nil {
		return false
	}
	select {
	case <-l.done:
		return false
	default:
		return true
	}
}
