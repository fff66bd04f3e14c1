package kafkautil

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stoppedBroker is what a SIGSTOPped broker looks like from a client: the
// kernel accepts the connection and takes the request, nothing answers.
func stoppedBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	return ln.Addr().String()
}

// A broker that leaves a request unanswered is reported by Hung past
// HungAfter; once the cluster's metadata no longer names it, its
// connections are cut (a read waiting on it ends at once, not at the read
// timeout) and dials to it fail; when the metadata names it again, it is
// dialled again.
func TestBrokerWatchCutsAFencedBroker(t *testing.T) {
	t.Parallel()
	stopped, other := stoppedBroker(t), stoppedBroker(t)
	w := NewBrokerWatch([]string{stopped}, NewConfig("test"), &BrokerWatchConfig{HungAfter: 200 * time.Millisecond})
	ctx := context.Background()

	conn, err := w.Dial("tcp", stopped)
	require.NoError(t, err)
	addr, _ := w.Hung()
	require.Empty(t, addr, "nothing asked yet")
	_, err = conn.Write([]byte("a request"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { a, _ := w.Hung(); return a == stopped }, 10*time.Second, 10*time.Millisecond)

	w.observe(ctx, []string{stopped, other})
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Minute)))
	read := make(chan error, 1)
	go func() { _, err := conn.Read(make([]byte, 1)); read <- err }()
	w.observe(ctx, []string{other}) // the controller fenced it
	select {
	case err := <-read:
		require.Error(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the read on the fenced broker's connection did not end")
	}
	addr, _ = w.Hung()
	require.Empty(t, addr, "a cut connection waits for nothing")
	_, err = w.Dial("tcp", stopped)
	require.ErrorContains(t, err, "fenced")

	w.observe(ctx, []string{stopped, other}) // back
	conn, err = w.Dial("tcp", stopped)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}
