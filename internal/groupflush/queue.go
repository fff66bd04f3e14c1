// Package groupflush gathers work that arrives while earlier work is being
// flushed, and flushes it in groups: the pattern behind the executor's
// group commit (ledger) and combined admission (pipeline), where one
// transaction for many callers costs about what one costs for a single
// caller.
package groupflush

import (
	"slices"
	"sync"
)

// Queue flushes the items added to it in groups. A caller that adds an
// item while fewer than Max flushes run starts one, which takes groups off
// the queue until it is empty, then ends: there is no background goroutine
// to stop, and an idle Queue holds none.
type Queue[T any] struct {
	// Max bounds the flushes running at once (at least 1).
	Max int
	// Take says how many of the queued items, oldest first, the next group
	// takes (at least 1, at most len(queued)).
	Take func(queued []T) int
	// Flush handles one group; it runs in the flushing goroutine.
	Flush func(group []T)

	mu       sync.Mutex
	queue    []T
	inFlight int
}

// Add queues item, starting a flush if fewer than Max run.
func (q *Queue[T]) Add(item T) {
	q.mu.Lock()
	q.queue = append(q.queue, item)
	start := q.inFlight < max(q.Max, 1)
	if start {
		q.inFlight++
	}
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

// State returns the items waiting and the flushes running (for tests).
func (q *Queue[T]) State() (queued, running int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue), q.inFlight
}

func (q *Queue[T]) drain() {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.inFlight--
			q.mu.Unlock()
			return
		}
		n := min(max(q.Take(q.queue), 1), len(q.queue))
		group := slices.Clone(q.queue[:n])
		q.queue = slices.Delete(q.queue, 0, n)
		q.mu.Unlock()
		q.Flush(group)
	}
}
