package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApplyProgress: `recovery apply` draws a progress bar on a terminal
// (mpb: the items applied of those that wait, the rate, the ETA) and
// writes a plain line per item otherwise, as logs and tests read them.
//
// It catches: a bar drawn into a log (no terminal), lines lost when there
// is no terminal, and a bar that does not end at what was applied.
func TestApplyProgress(t *testing.T) {
	t.Parallel()

	t.Run("LinesWithoutATerminal", func(t *testing.T) {
		t.Parallel()
		var w bytes.Buffer
		p := newApplyProgress(&w, false, 3, 0)
		p.applied(1, "s1: rewoken")
		p.applied(2, "s2: reconciled")
		p.finish()
		require.Equal(t, "applied 1…  s1: rewoken\napplied 2…  s2: reconciled\n", w.String())

		w.Reset()
		p = newApplyProgress(&w, false, 3, 2)
		p.applied(1, "s1: rewoken")
		p.finish()
		require.Equal(t, "applied 1/2  s1: rewoken\n", w.String())
	})

	t.Run("ABarOnATerminal", func(t *testing.T) {
		t.Parallel()
		var w bytes.Buffer
		p := newApplyProgress(&w, true, 5, 0)
		p.applied(1, "s1: rewoken")
		p.applied(2, "s2: rewoken")
		p.applied(3, "s3: continued")
		p.finish()
		out := w.String()
		require.NotContains(t, out, "applied 1…", "a terminal gets a bar, not lines")
		require.Contains(t, out, "applied 3/3", "the bar ends at what was applied (two changed since they were counted)")
		require.Contains(t, out, "s3", "the bar shows the last item")
	})

	t.Run("MaxBoundsTheBarAndLateClaimsLengthenIt", func(t *testing.T) {
		t.Parallel()
		var w bytes.Buffer
		p := newApplyProgress(&w, true, 50, 2)
		require.Equal(t, int64(2), p.total, "--max bounds the bar")
		p.applied(1, "s1: rewoken")
		p.applied(2, "s2: rewoken")
		p.applied(3, "s3: rewoken")
		require.Equal(t, int64(3), p.total, "a claim that expired since the count lengthens the bar")
		p.finish()
		require.Contains(t, w.String(), "applied 3/3")
	})
}
