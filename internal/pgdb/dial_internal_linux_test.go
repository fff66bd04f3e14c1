package pgdb

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The pool's connections give up a silent peer: TCP_USER_TIMEOUT is the
// round trip's bound, and keepalives probe an idle connection.
func TestDialerGivesUpASilentPeer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	c, err := dialer(time.Second, 9*time.Second).DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var userTimeout, keepAlive, idle int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		userTimeout, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if gerr == nil {
			keepAlive, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		}
		if gerr == nil {
			idle, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		}
	}))
	require.NoError(t, gerr)
	require.Equal(t, 9000, userTimeout, "TCP_USER_TIMEOUT in milliseconds")
	require.Equal(t, 1, keepAlive)
	require.Equal(t, 3, idle, "keepalive idle: a third of the round trip, in seconds")
}
