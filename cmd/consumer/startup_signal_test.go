package main

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// silentListener accepts TCP connections and never answers on them, as a
// server that hangs; accepted receives at the first connection.
func silentListener(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(ch) })
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), ch
}

// A SIGTERM is the normal stop of the service, whenever it comes: one
// that comes while the consumer still starts (here, while it waits for a
// dependency that does not answer) stops it at once and cleanly, exit 0,
// not with "context canceled" and exit 1 (which an orchestrator counts as
// a crash, and which failed a crash-sweep run whose second process was
// stopped while it connected).
func TestSigtermDuringStartupStopsCleanly(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, testPartitions).Addr()
	_, dbURL := testkit.Pool(t)
	for _, tc := range []struct {
		name string
		hang func(b *testBundle, silent string)
	}{
		{"postgres", func(b *testBundle, silent string) {
			b.dbURL = "postgres://u:p@" + silent + "/db?sslmode=disable&connect_timeout=60"
		}},
		{"kafka", func(b *testBundle, silent string) { b.addr = silent }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			silent, accepted := silentListener(t)
			b := &testBundle{addr: addr, dbURL: dbURL, group: "test-" + uuid.NewString()}
			tc.hang(b, silent)
			p := b.start(t, "consumer", "")
			select {
			case <-accepted:
			case <-time.After(60 * time.Second):
				require.FailNow(t, "the consumer never connected to the silent "+tc.name, p.stderr.String())
			}
			signalled := time.Now()
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			// Postgres and Sarama's constructors end at the signal; the
			// broker watch's metadata read in flight does not (Sarama's
			// takes no context, and ends at its read timeouts: 9s and 27s
			// were measured against a silent broker), and the watch's Stop waits for
			// it, so that nothing it opened outlives the process's stop.
			st := p.waitExit(t, 90*time.Second)
			t.Logf("exited %s after the signal", time.Since(signalled).Round(time.Millisecond))
			require.True(t, st.Success(), "SIGTERM during startup should stop the consumer cleanly, it ended with %s\n%s", st, p.stderr.String())
			require.NotNil(t, findLog(p.stderr.String(), "consumer stopped during startup"), p.stderr.String())
		})
	}
}
