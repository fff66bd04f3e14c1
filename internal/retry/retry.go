// Package retry is the one way promptline runs a step again after a
// failure that may pass (a lost connection, a transaction the server
// refused, a broker that is away): exponential backoff with jitter, until
// the step succeeds, fails for good, has had its tries, or the context
// ends.
//
// The waits come from github.com/cenkalti/backoff/v5 (already in the
// module through Watermill). This package only fixes how promptline uses
// it, so that each caller states a Policy instead of writing a loop: the
// error returned is always the step's last one (the library returns the
// context's instead), there is no overall time limit unless the caller
// sets one (the library stops after 15 minutes by default), and a retry is
// announced to OnRetry so that the caller logs or counts it.
//
// The claim's write retry (ledger/retry.go) keeps its own loop: it is
// bounded by the lease, computes a last try before the lease ends and runs
// each try under the lease's deadline (docs/design.md, invariant 4), which
// a policy of tries and waits cannot say.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy says how a step is run again.
type Policy struct {
	// Min is the wait before the second try; each further wait doubles,
	// up to Max. Each wait is drawn within ±50% of its value.
	Min, Max time.Duration
	// Tries bounds the tries in all, the first included. 0: no bound.
	Tries int
	// Final reports whether an error is one that another try would give
	// again (a data error, a rejection): Do returns it at once. Nil:
	// every error is worth another try.
	Final func(error) bool
	// OnRetry is called before each wait, with the number of the try
	// that failed (1 for the first), its error and the wait.
	OnRetry func(try int, err error, wait time.Duration)
}

// Do runs step until it returns nil, returns an error that p.Final calls
// final, has run p.Tries times, or ctx ends (during a wait, or before a
// retry). It returns nil or step's last error.
func Do(ctx context.Context, p Policy, step func() error) error {
	var last error
	tries := 0
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.Min,
		RandomizationFactor: backoff.DefaultRandomizationFactor,
		Multiplier:          2,
		MaxInterval:         p.Max,
	}
	opts := []backoff.RetryOption{
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			if p.OnRetry != nil {
				p.OnRetry(tries, err, wait)
			}
		}),
	}
	if p.Tries > 0 {
		opts = append(opts, backoff.WithMaxTries(uint(p.Tries)))
	}
	if _, err := backoff.Retry(ctx, func() (struct{}, error) {
		tries++
		last = step()
		if last != nil && p.Final != nil && p.Final(last) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, opts...); err == nil {
		return nil
	}
	// The library returns the context's error when ctx ends; the caller
	// gets the step's. step ran at least once and failed.
	return last
}
