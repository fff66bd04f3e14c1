package executor

import (
	"strings"
	"sync"
	"time"

	"github.com/promptline/promptline/envelope"
)

// Coalescing of live deltas: a provider streams many small fragments; one
// Kafka message per fragment would cost more than the text is worth.
const (
	deltaIntervalDefault = 50 * time.Millisecond
	deltaMaxBytesDefault = 1024
)

// deltaStream coalesces one provider request's text fragments into deltas:
// buffered text is published once it reaches maxBytes, or interval after
// its first byte arrived, whichever comes first, and at the end of the
// request. It is written from the provider's goroutine and flushed from a
// timer; after close it publishes nothing.
type deltaStream struct {
	sink     DeltaSink
	base     envelope.Delta
	interval time.Duration
	maxBytes int

	mu     sync.Mutex
	buf    strings.Builder
	seq    int64
	timer  *time.Timer
	gen    int // the timer's generation: a stale tick flushes nothing
	closed bool
}

func newDeltaStream(sink DeltaSink, base envelope.Delta, interval time.Duration, maxBytes int) *deltaStream {
	return &deltaStream{sink: sink, base: base, interval: interval, maxBytes: maxBytes}
}

// write buffers a fragment of text (a TextDeltaFunc).
func (s *deltaStream) write(text string) {
	if text == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.buf.WriteString(text)
	if s.buf.Len() >= s.maxBytes {
		s.flushLocked()
		return
	}
	if s.timer == nil {
		gen := s.gen
		s.timer = time.AfterFunc(s.interval, func() { s.tick(gen) })
	}
}

func (s *deltaStream) tick(gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || gen != s.gen {
		return
	}
	s.flushLocked()
}

func (s *deltaStream) flushLocked() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
		s.gen++
	}
	if s.buf.Len() == 0 {
		return
	}
	s.seq++
	d := s.base
	d.Seq, d.Text, d.At = s.seq, s.buf.String(), time.Now().UTC()
	s.buf.Reset()
	s.sink.PublishDelta(d)
}

// close publishes what is buffered and ends the stream.
func (s *deltaStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.flushLocked()
	s.closed = true
}
