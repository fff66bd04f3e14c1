package executor

import (
	"sync"
)

// Local wakes. A prompt admitted by this process for a session whose wakes
// partition this process also owns (the usual case: prompts and wakes share
// the key, the partition count and the group's range assignment) need not
// wait for its wake to travel through the relay and Kafka before it runs:
// right after the admission commits, the consumer hands the session to the
// executor directly, as if the wake had arrived (docs/design.md: a wake is only a
// hint; an extra or a missing one costs latency, never a promise).
//
// The wake itself is still written, published and consumed, so a crash
// changes nothing: it is redelivered to whoever owns the partition then.
// When it reaches this process after the local wake was taken, it is a
// duplicate of it — the local run started after the admission committed, so
// it sees the wake's inputs, exactly as the wake's own run would have — and
// it takes the local run's completion instead of starting another one: its
// offset is marked once that run has gone idle, as for any wake.
//
// Measured on the end-to-end bench (docs/benchmarks.md).

// localWakes remembers the wakes delivered locally, by their exact bytes
// (the outbox payload the relay publishes), until they arrive from Kafka.
// It is bounded: a wake that never arrives here (the partition moved) is
// forgotten when its partition is revoked, and everything is forgotten when
// the bound is reached — a forgotten entry only costs the wake its normal
// handling.
type localWakes struct {
	mu      sync.Mutex
	byValue map[string]localWake
}

type localWake struct {
	partition int32
	done      <-chan struct{}
}

// maxLocalWakes bounds the remembered local wakes (each some 150 bytes).
const maxLocalWakes = 1 << 16

func (l *localWakes) add(value []byte, partition int32, done <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byValue == nil || len(l.byValue) >= maxLocalWakes {
		l.byValue = map[string]localWake{}
	}
	l.byValue[string(value)] = localWake{partition: partition, done: done}
}

// take returns and forgets the local run that a wake with these bytes,
// arriving on partition, duplicates.
func (l *localWakes) take(value []byte, partition int32) (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.byValue[string(value)]
	if !ok || w.partition != partition {
		return nil, false
	}
	delete(l.byValue, string(value))
	return w.done, true
}

// forget drops the entries of revoked partitions.
func (l *localWakes) forget(partitions []int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for v, w := range l.byValue {
		for _, p := range partitions {
			if w.partition == p {
				delete(l.byValue, v)
				break
			}
		}
	}
}

// clear forgets every entry: after a stop, a wake arriving from Kafka
// starts its own run instead of taking the completion of a run the stop
// may have cut short before it looked at the session.
func (l *localWakes) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byValue = nil
}
