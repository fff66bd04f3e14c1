// Package startstoptest checks a service against the startstop contract.
package startstoptest

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/internal/testkit"
)

// Service is a service under the startstop contract.
type Service interface {
	Start(ctx context.Context) error
	Stop()
}

const (
	goroutines = 8
	rounds     = 25
	// stopWithin bounds each step: a Stop that never returns fails the
	// test instead of hanging it. The relay's last pass alone may take 5s.
	stopWithin = time.Minute
)

// Stress checks svc against the contract: Stop before Start returns at
// once, Start twice fails with startstop.ErrStarted, Stop twice is fine, a
// stopped service starts again (also when its ctx ended instead of a
// Stop), and goroutines starting and stopping it at once neither panic
// (a panic ends the test binary) nor hang; in the end svc is stopped and
// no goroutine started meanwhile is left.
//
// svc is started and stopped a few hundred times: build it so that a pass
// is cheap (a short interval is fine, it is cancelled at each Stop).
// Build its dependencies (pools, producers) before the call, and warm up
// any that start goroutines of their own on first use, or the leak check
// counts them; ignore lists the goroutines of a dependency that it must
// not count (beyond testkit.LeakOptions).
func Stress(t *testing.T, svc Service, ignore ...goleak.Option) {
	t.Helper()
	// The leak check counts every goroutine of the test binary started
	// meanwhile, so no other test may run beside this one; t.Setenv
	// panics in a parallel test, which says so early.
	t.Setenv("PROMPTLINE_STARTSTOP_STRESS", "1")
	ignore = append(ignore, goleak.IgnoreCurrent())
	ctx := t.Context()

	within(t, "Stop before Start", svc.Stop)
	require.NoError(t, svc.Start(ctx))
	require.ErrorIs(t, svc.Start(ctx), startstop.ErrStarted, "Start twice without Stop")
	within(t, "Stop", svc.Stop)
	within(t, "a second Stop", svc.Stop)
	require.NoError(t, svc.Start(ctx), "Start after Stop")
	within(t, "Stop after a restart", svc.Stop)

	within(t, "concurrent Starts and Stops", func() {
		var wg sync.WaitGroup
		errs := make(chan error, goroutines*rounds)
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					if err := svc.Start(ctx); err != nil && !errors.Is(err, startstop.ErrStarted) {
						errs <- err
					}
					runtime.Gosched()
					svc.Stop()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Start: %v", err)
		}
	})

	// A service whose ctx ended has stopped by itself: it starts again
	// without a Stop.
	ended, end := context.WithCancel(ctx)
	require.NoError(t, svc.Start(ended))
	end()
	require.Eventually(t, func() bool { return svc.Start(ctx) == nil }, stopWithin, time.Millisecond,
		"Start after the ctx of the last one ended")
	within(t, "the last Stop", svc.Stop)

	if err := goleak.Find(append(testkit.LeakOptions(), ignore...)...); err != nil {
		t.Errorf("goroutines left after the last Stop: %v", err)
	}
}

// within runs f and fails the test if it has not returned in stopWithin,
// with every goroutine's stack to show where it hangs.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(stopWithin):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s has not returned after %v; goroutines:\n%s", what, stopWithin, buf[:runtime.Stack(buf, true)])
	}
}
