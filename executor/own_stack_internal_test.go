package executor

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// onOwnStack is its fn for the caller: what fn sets is set when it
// returns, and a runtime.Goexit in fn ends the caller's goroutine (its
// deferred calls run, nothing after the call does), as it would have
// with fn called in place: the executor's run relies on it
// (endedWithoutReturning).
func TestOnOwnStackIsItsFnForTheCaller(t *testing.T) {
	t.Parallel()
	var got int
	onOwnStack(func() { got = 42 })
	require.Equal(t, 42, got)

	after, deferred := false, false
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { deferred = true }()
		onOwnStack(runtime.Goexit)
		after = true
	}()
	<-done
	require.True(t, deferred, "the caller's deferred calls ran")
	require.False(t, after, "nothing after the call ran: the caller's goroutine ended with fn's")
}
