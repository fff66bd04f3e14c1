package pipeline

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWakeMarks(t *testing.T) {
	t.Parallel()
	newMarks := func() (*wakeMarks, *[]int64) {
		var commits []int64
		return newWakeMarks(func(next int64) { commits = append(commits, next) }), &commits
	}

	t.Run("CommitsUpToTheFirstRunStillGoing", func(t *testing.T) {
		t.Parallel()
		w, commits := newMarks()
		a, b := make(chan struct{}), make(chan struct{})
		w.add(10, a)
		w.add(11, nil) // nothing to wait for (an invalid wake)
		w.add(12, b)
		require.Equal(t, []int64{10}, *commits, "the wake at 10 is not committed while its run goes")
		close(b)
		w.mark()
		require.Equal(t, []int64{10}, *commits, "a later run's end commits nothing past an earlier run")
		require.False(t, w.idle())
		require.Equal(t, (<-chan struct{})(a), w.head())
		close(a)
		w.mark()
		require.Equal(t, []int64{10, 13}, *commits)
		require.True(t, w.idle())
		require.Nil(t, w.head())
	})

	t.Run("WakesThatJoinedARunShareItsFirstOffset", func(t *testing.T) {
		t.Parallel()
		w, commits := newMarks()
		a, b := make(chan struct{}), make(chan struct{})
		w.add(0, a)
		w.add(1, b)
		w.add(2, a) // joined a's run
		close(b)
		w.mark()
		require.Equal(t, []int64{0}, *commits)
		close(a)
		w.mark()
		require.Equal(t, []int64{0, 3}, *commits, "a's end commits past its later wake too")
		require.True(t, w.idle())
	})

	t.Run("EndedRunsAreCommittedAtOnce", func(t *testing.T) {
		t.Parallel()
		w, commits := newMarks()
		ended := make(chan struct{})
		close(ended)
		w.add(5, ended)
		w.add(6, nil)
		require.Equal(t, []int64{6, 7}, *commits)
		require.True(t, w.idle())
	})

	t.Run("BoundedByTheRunsStillGoing", func(t *testing.T) {
		t.Parallel()
		w, commits := newMarks()
		long := make(chan struct{})
		w.add(0, long)
		const n = 10_000
		offset := int64(0)
		for range n {
			r := make(chan struct{})
			offset++
			w.add(offset, r)
			offset++
			w.add(offset, r) // joined r's run, as a session's next prompt's wake does
			offset++
			w.add(offset, long) // and the long run's session's next prompt
			close(r)
			// Swept out when wakeMarksSweepMin runs are kept: never as many.
			require.Less(t, len(w.runs), wakeMarksSweepMin, "runs that ended behind a long one, or wakes that joined it, are kept")
		}
		require.Len(t, w.seen, len(w.runs))
		require.Equal(t, []int64{0}, *commits, "nothing past the long run is committed while it goes")
		close(long)
		w.mark()
		require.Equal(t, []int64{0, offset + 1}, *commits)
		require.True(t, w.idle())
		require.Empty(t, w.seen)
	})

	// The long run at the head ends while wakes keep arriving (the
	// partition's goroutine takes a wake before it sees the end), and the
	// wake that brings the runs to the sweep's length is of a run that
	// ended already (a local run gone idle before its wake came back from
	// Kafka): the sweep finds nothing going.
	t.Run("SweepThatFindsEveryRunEnded", func(t *testing.T) {
		t.Parallel()
		w, commits := newMarks()
		long := make(chan struct{})
		w.add(0, long)
		offset := int64(0)
		for range wakeMarksSweepMin - 2 {
			r := make(chan struct{})
			offset++
			w.add(offset, r)
			close(r)
		}
		// Kept until the runs reach the sweep's length, not swept at every
		// wake: a sweep costs the runs kept, and is paid for by as many
		// wakes (sweep).
		require.Len(t, w.runs, wakeMarksSweepMin-1)
		close(long)
		ended := make(chan struct{})
		close(ended)
		offset++
		w.add(offset, ended)
		require.True(t, w.idle())
		require.Empty(t, w.seen)
		require.Equal(t, []int64{0, offset + 1}, *commits)
	})
}
