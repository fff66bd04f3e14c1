package replay

import (
	"context"
	"sync"
	"time"
)

// limiter paces batches to a rate shared by all partitions: each batch
// reserves its slot on a common schedule and waits for it.
type limiter struct {
	rate float64 // per second; 0: no limit
	mu   sync.Mutex
	next time.Time
}

func newLimiter(rate float64) *limiter { return &limiter{rate: rate} }

// wait blocks until n more messages fit the rate; false if ctx ended.
func (l *limiter) wait(ctx context.Context, n int) bool {
	if l.rate <= 0 {
		return ctx.Err() == nil
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
