package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamMeasurement runs `bench stream` at a tiny scale: both kinds of
// run answer every prompt, only the streamed ones put deltas on
// session-deltas, and the ratios come from those runs.
func TestStreamMeasurement(t *testing.T) {
	cmd := newRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"stream", "--prompts", "200", "--rounds", "1", "--partitions", "4", "--rate", "50", "--duration", "2s", "--json"})
	require.NoError(t, cmd.ExecuteContext(context.Background()), stderr.String())
	var r streamResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r))
	require.Len(t, r.Whole, 1)
	require.Len(t, r.Stream, 1)
	require.EqualValues(t, 200, r.Whole[0].Turns)
	require.EqualValues(t, 200, r.Stream[0].Turns)
	require.Zero(t, r.Whole[0].DeltasPerTurn, "an answer returned whole publishes no delta")
	require.GreaterOrEqual(t, r.Stream[0].DeltasPerTurn, 1.0)
	require.InDelta(t, r.Stream[0].TurnsPerSecond/r.Whole[0].TurnsPerSecond, r.Ratios.TurnsPerSecond, 1e-9)
	require.Len(t, r.LatencyWhole, 1)
	require.Len(t, r.LatencyStream, 1)
	require.Zero(t, r.LatencyWhole[0].DeltasPublished)
	require.GreaterOrEqual(t, r.LatencyStream[0].DeltasPublished, int64(r.LatencyStream[0].Completed))
	require.Positive(t, r.LatencyStream[0].Turn.P50)
}
