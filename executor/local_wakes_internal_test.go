package executor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A local wake is matched once, only on its partition; revoking the
// partition forgets it; the memory is bounded.
func TestLocalWakesMatching(t *testing.T) {
	t.Parallel()
	var l localWakes
	done := make(chan struct{})
	l.add([]byte(`{"session_id":"a"}`), 3, done)
	_, ok := l.take([]byte(`{"session_id":"a"}`), 2)
	require.False(t, ok, "another partition's wake is not this one")
	got, ok := l.take([]byte(`{"session_id":"a"}`), 3)
	require.True(t, ok)
	require.Equal(t, (<-chan struct{})(done), got)
	_, ok = l.take([]byte(`{"session_id":"a"}`), 3)
	require.False(t, ok, "matched once only")

	l.add([]byte("x"), 1, done)
	l.add([]byte("y"), 2, done)
	l.forget([]int32{1})
	_, ok = l.take([]byte("x"), 1)
	require.False(t, ok, "revoked partition's entry kept")
	_, ok = l.take([]byte("y"), 2)
	require.True(t, ok)

	// Wakes of several sessions are kept together, each matched.
	l.add([]byte("p"), 0, done)
	l.add([]byte("q"), 0, done)
	_, ok = l.take([]byte("p"), 0)
	require.True(t, ok, "an earlier wake is kept when another is added")
	_, ok = l.take([]byte("q"), 0)
	require.True(t, ok)

	// Full at maxLocalWakes: the next wake starts the memory afresh (a
	// wake forgotten is only read from the topic, as any other process's).
	l = localWakes{}
	for i := range maxLocalWakes {
		l.add(fmt.Appendf(nil, "w%d", i), 0, done)
	}
	require.Len(t, l.byValue, maxLocalWakes)
	l.add([]byte("one more"), 0, done)
	require.Len(t, l.byValue, 1)
}
