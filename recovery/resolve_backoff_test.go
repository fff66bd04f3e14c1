package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// Resolve tries its transaction five times on transient errors, waiting
// longer before each try (100 ms, 200 ms, ...), and then returns the error:
// a session held for good by a stuck writer makes every try time out on
// its lock, and the four waits add up to a second at least.
func TestResolveBacksOffBetweenTries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, call := b.unknownCall(t, "s")
	short := b.poolWith(t, map[string]string{"lock_timeout": "10ms"})
	b.holdSession(t, "s")
	var transient []time.Time
	start := time.Now()
	_, err := recovery.Resolve(context.Background(), short, "s", call.ID, &recovery.ResolveOpts{
		Finding: recovery.FindingDidNotRun, Operator: "alice",
		OnTransientFunc: func(error) { transient = append(transient, time.Now()) }})
	require.Error(t, err)
	require.True(t, pgdb.Transient(err), "%v", err)
	require.Len(t, transient, 4, "five tries: four transient errors tried again, the fifth returned")
	require.GreaterOrEqual(t, time.Since(start), time.Second, "waits of 100, 200, 300 and 400 ms between the tries")
	require.GreaterOrEqual(t, transient[3].Sub(transient[2]), 300*time.Millisecond, "the third wait is 300 ms")
	require.Zero(t, b.count(t, `SELECT count(*) FROM resolutions`))
}
