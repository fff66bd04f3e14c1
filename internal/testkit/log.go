package testkit

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger returns a debug-level text logger that writes to the test's log
// (shown on failure) and, when also is not nil, to also.
func Logger(tb testing.TB, also io.Writer) *slog.Logger {
	var w io.Writer = testWriter{tb}
	if also != nil {
		w = io.MultiWriter(w, also)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testWriter sends log lines to the test's log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// LogBuffer is a log sink that a service's goroutines and the test share:
// pass it to Logger, read it with String.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
