package replay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/replay"
)

// TestReplayReport: what the final report says besides the counts.
func TestReplayReport(t *testing.T) {
	t.Parallel()

	t.Run("RateAndPartitionsWithNothingReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		partition := b.sendSession(t, "s-report", 3)
		rep := b.runWithin(t, replay.Config{}, 30*time.Second)
		require.Equal(t, int64(3), rep.Totals.Messages)
		require.Positive(t, rep.Seconds)
		require.InEpsilon(t, float64(rep.Totals.Messages)/rep.Seconds, rep.Rate, 1e-9, "messages per second over the run")
		require.Len(t, rep.Partitions, partitions)
		for _, p := range rep.Partitions {
			if p.Partition == partition {
				continue
			}
			require.Zero(t, p.Messages)
			require.Equal(t, int64(-1), p.First, "no offset replayed on partition %d", p.Partition)
			require.Equal(t, int64(-1), p.Last, "no offset replayed on partition %d", p.Partition)
		}
	})

	t.Run("RejectionsListedUpToMaxRejections", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 3 {
			b.sendRaw(t, "prompts", "s-bad", []byte(`{"message_id":`), time.Time{})
		}
		rep := b.runWithin(t, replay.Config{MaxRejections: 2}, 30*time.Second)
		require.Equal(t, int64(3), rep.Totals.Malformed)
		require.Equal(t, map[string]int64{envelope.ReasonInvalidJSON: 3}, rep.Reasons, "all are counted")
		require.Len(t, rep.Rejections, 2, "two are listed")
		require.Equal(t, int64(1), rep.RejectionsOmitted)
	})
}
