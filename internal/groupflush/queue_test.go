package groupflush

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Items added while Max flushes run wait, and the next flush takes them
// as groups of the size Take says; every item is flushed once.
func TestQueueGroupsWhatWaits(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var groups [][]int
	var wg sync.WaitGroup
	q := &Queue[int]{
		Max:  2,
		Take: func(queued []int) int { return min(len(queued), 3) },
		Flush: func(g []int) {
			<-release // every flush holds until released
			mu.Lock()
			groups = append(groups, g)
			mu.Unlock()
			for range g {
				wg.Done()
			}
		},
	}
	wg.Add(9)
	for i := range 2 { // each starts a flush, which takes it alone and holds
		q.Add(i)
		require.Eventually(t, func() bool { n, r := q.State(); return n == 0 && r == i+1 }, time.Second, time.Millisecond)
	}
	for i := 2; i < 9; i++ {
		q.Add(i)
	}
	queued, running := q.State()
	require.Equal(t, 7, queued)
	require.Equal(t, 2, running, "never more than Max flushes")
	close(release)
	wg.Wait()
	require.Eventually(t, func() bool { n, r := q.State(); return n == 0 && r == 0 }, time.Second, time.Millisecond)

	seen := map[int]int{}
	for _, g := range groups {
		require.LessOrEqual(t, len(g), 3)
		for _, v := range g {
			seen[v]++
		}
	}
	require.Len(t, seen, 9)
	for v, n := range seen {
		require.Equal(t, 1, n, "item %d flushed %d times", v, n)
	}
	// 2 alone, then 7 waiting in groups of at most 3: 3 groups.
	require.Len(t, groups, 5)
}
