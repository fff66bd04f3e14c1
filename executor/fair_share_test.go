package executor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider/scripted"
)

// A run that hands its session back (FairShare: another session waits for
// the only slot) writes a wake with its release. That wake may arrive
// while the run is still ending: it must start a run of its own, not join
// the ending one, or its offset would be committed with the session's
// inputs left waiting and nothing to run them.
func TestHandedBackSessionRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "a"})
	e := newExecutor(t, b.pool, &executor.ExecutorConfig{
		Claims: claims, Provider: scripted.ScriptedProvider{}, MaxSessions: 1, FairShare: 100 * time.Millisecond,
	})
	t.Cleanup(e.StopNow)

	const n = 4
	for i := range n {
		b.admit(t, "long", fmt.Sprintf("long-%d", i), "/sleep 200ms")
	}
	b.admit(t, "other", "other", "hi")

	// The release's wake, as the consumer would hand it over, arrives
	// while the handed-back run is ending.
	var (
		once  sync.Once
		again = make(chan (<-chan struct{}), 1)
	)
	executor.SetBeforeRunEnds(e, func(session string) {
		if session != "long" {
			return
		}
		once.Do(func() {
			returned := make(chan struct{})
			go func() {
				defer close(returned)
				done, err := e.Wake(ctx, "long", 0)
				if err == nil {
					again <- done
				}
			}()
			// The wake has either joined this run (returned at once) or
			// waits for a slot behind the other session's.
			deadline := time.After(10 * time.Second)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for executor.SlotWaiters(e) < 2 {
				select {
				case <-returned:
					return
				case <-deadline:
					return // the assertions below fail
				case <-tick.C:
				}
			}
		})
	})

	first, err := e.Wake(ctx, "long", 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.answered(t, "long-0") == 1 }, 20*time.Second, 5*time.Millisecond)
	// Another session waits for the only slot.
	otherDone := make(chan (<-chan struct{}), 1)
	go func() {
		done, err := e.Wake(ctx, "other", 0)
		if err == nil {
			otherDone <- done
		}
	}()
	wait(t, first)
	require.Less(t, b.answered(t, fmt.Sprintf("long-%d", n-1)), 1, "the long run never handed its session back: the test proved nothing")
	wait(t, <-otherDone)
	require.Equal(t, 1, b.answered(t, "other"))
	wait(t, <-again)
	for i := range n {
		require.Equal(t, 1, b.answered(t, fmt.Sprintf("long-%d", i)), "long-%d left waiting", i)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = 'long' AND convert_from(payload, 'UTF8')::jsonb ->> 'reason' = 'released'`),
		"the hand-back wrote its wake")
	require.Eventually(t, func() bool { return executor.HandBacks(e) == 0 }, 10*time.Second, 5*time.Millisecond,
		"the hand-back is still owed after its run freed its slot")
}
