package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// The queue between Sarama's channel and admission holds values up to the
// gate's bytes by their real sizes: many small ones at hand for a batch,
// few large ones, one at least; a release lets the next in, and the reader
// stops when its context ends.
func TestReadBoundedHoldsItsBytes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	in := make(chan *sarama.ConsumerMessage, 2000)
	for i := range 1000 {
		in <- &sarama.ConsumerMessage{Offset: int64(i), Value: make([]byte, 100)}
	}
	for i := range 10 {
		in <- &sarama.ConsumerMessage{Offset: int64(1000 + i), Value: make([]byte, 1<<20)}
	}
	gate := newByteGate(2 << 20)
	out := make(chan *sarama.ConsumerMessage, 1024)
	done := make(chan struct{})
	go func() { readBounded(ctx, in, out, gate); close(done) }()

	// The small ones all pass (100 KB), then one large (1 MiB more); the
	// second large would pass 2 MiB and waits.
	require.Eventually(t, func() bool { return len(out) == 1001 }, 10*time.Second, time.Millisecond)
	require.Never(t, func() bool { return len(out) > 1001 }, 100*time.Millisecond, time.Millisecond)
	taken := 0
	for range 1001 {
		taken += len((<-out).Value)
	}
	gate.release(taken)
	// Released, two large ones fill the 2 MiB again.
	require.Eventually(t, func() bool { return len(out) == 2 }, 10*time.Second, time.Millisecond)
	require.Never(t, func() bool { return len(out) > 2 }, 100*time.Millisecond, time.Millisecond)
	// A value larger than the gate passes when nothing is held.
	big := newByteGate(1)
	require.True(t, big.acquire(ctx, 1<<20), "a value larger than the gate passes alone")

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not stop with its context")
	}
}
