package main

import (
	"context"
	"errors"
	"log/slog"
)

// awaitStart returns open's result, or ctx's error as soon as ctx is done
// while open still runs. Sarama's constructors (NewClient and the clients
// built on it) take no context and, against a broker that accepts
// connections and answers nothing, block for their read timeouts times
// their retries; a signal during the start must not wait for that (an
// orchestrator's grace would run out and kill the process). Sarama offers
// no cancellable variant, hence this small wrapper. An abandoned open is
// left to finish on its own; what it then opens is closed with closeFn.
func awaitStart[T any](ctx context.Context, open func() (T, error), closeFn func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := open()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil && closeFn != nil {
				closeFn(r.v)
			}
		}()
		var zero T
		return zero, ctx.Err() // not Cause: stoppedDuringStartup looks for context.Canceled
	}
}

// stoppedDuringStartup reports whether run's error is only the signal that
// came while the consumer still started (running is false): the service's
// normal stop, which run logs and turns into a clean exit. Any other error
// (a refused login, a statement timeout, a missing topic) is not, signal or
// not.
func stoppedDuringStartup(ctx context.Context, err error, running bool, log *slog.Logger) bool {
	if err == nil || running || ctx.Err() == nil || !errors.Is(err, context.Canceled) {
		return false
	}
	log.Info("consumer stopped during startup", slog.String("interrupted", err.Error()))
	return true
}
