package executor

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// sinkLog is a DeltaSink that keeps what it is given.
type sinkLog struct {
	mu     sync.Mutex
	deltas []envelope.Delta
}

func (s *sinkLog) PublishDelta(d envelope.Delta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deltas = append(s.deltas, d)
}

func (s *sinkLog) texts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, d := range s.deltas {
		out = append(out, d.Text)
	}
	return out
}

// Every interval after text arrives, what is buffered goes out, not only
// the first time: each flush leaves the stream ready to time the next
// text. A flush by size does the same, and close sends the rest once.
func TestDeltaStreamFlushesEachIntervalAgain(t *testing.T) {
	t.Parallel()
	sink := &sinkLog{}
	s := newDeltaStream(sink, envelope.Delta{SessionID: "s"}, 20*time.Millisecond, 8)
	for i, text := range []string{"one ", "two ", "three "} {
		s.write(text)
		require.Eventually(t, func() bool { return len(sink.texts()) == i+1 }, 5*time.Second, time.Millisecond,
			"delta %d, by the timer", i+1)
	}
	s.write("full bytes") // past maxBytes: at once
	require.Equal(t, []string{"one ", "two ", "three ", "full bytes"}, sink.texts())
	s.write("x")
	require.Eventually(t, func() bool { return len(sink.texts()) == 5 }, 5*time.Second, time.Millisecond,
		"timed again after a flush by size")
	s.write("tail")
	s.close()
	s.close()
	s.write("after")
	// Closed: no timer left to flush, nothing buffered.
	s.mu.Lock()
	require.Nil(t, s.timer)
	require.Zero(t, s.buf.Len())
	s.mu.Unlock()
	require.Equal(t, []string{"one ", "two ", "three ", "full bytes", "x", "tail"}, sink.texts())
	for i, d := range sink.deltas {
		require.Equal(t, int64(i+1), d.Seq)
		require.Equal(t, "s", d.SessionID)
	}
}
