package executor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One session waiting for a slot sends one run back, once that run has
// had its fair share; a second waiter, a second run.
func TestOwesSlot(t *testing.T) {
	t.Parallel()
	e := &Executor{cfg: ExecutorConfig{FairShare: time.Second}}
	long := time.Now().Add(-time.Minute)
	require.False(t, e.owesSlot(long), "no one waits")
	e.slotWaiters.Store(2)
	require.False(t, e.owesSlot(time.Now()), "not had its share")
	require.True(t, e.owesSlot(long))
	require.True(t, e.owesSlot(long))
	require.False(t, e.owesSlot(long), "two waiters, two runs sent back already")
	e.handBacks.Add(-1) // one freed its slot
	require.True(t, e.owesSlot(long))
}
