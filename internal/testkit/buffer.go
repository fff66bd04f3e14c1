package testkit

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a writer that a running process or command and the test
// share: the test waits on Changed, not on time.
type SyncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

// NewSyncBuffer returns an empty SyncBuffer.
func NewSyncBuffer() *SyncBuffer { return &SyncBuffer{changed: make(chan struct{}, 1)} }

// Write appends p and signals Changed.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return n, err
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Changed receives after writes (coalesced: one signal may stand for many).
func (b *SyncBuffer) Changed() <-chan struct{} { return b.changed }

// WaitFor returns once the buffer contains s, failing the test after
// timeout.
func (b *SyncBuffer) WaitFor(tb testing.TB, s string, timeout time.Duration) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !strings.Contains(b.String(), s) {
		select {
		case <-b.Changed():
		case <-deadline.C:
			tb.Fatalf("waiting for %q; have %q", s, b.String())
		}
	}
}
