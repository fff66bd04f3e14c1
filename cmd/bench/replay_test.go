package main

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayMeasurement runs the replay figures at a tiny scale.
func TestReplayMeasurement(t *testing.T) {
	sc, err := newScratchServer(t.Context(), os.Getenv("DATABASE_URL"), t.Logf)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sc.close(context.Background())) })
	r, err := measureReplay(t.Context(), sc, nil, 300, 4, nil, 0, t.Logf)
	require.NoError(t, err)
	require.Equal(t, int64(300), r.Fresh.Admitted)
	require.Equal(t, int64(300), r.Duplicates.Dupes)
	require.Positive(t, r.Fresh.Rate)
	require.Positive(t, r.Duplicates.Rate)
	require.Positive(t, r.DryRun.Rate)
}
