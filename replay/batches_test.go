package replay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/replay"
)

// batchLog records what OnBatchFunc reports: the next offset after each
// durable batch, by partition.
type batchLog struct {
	mu    sync.Mutex
	nexts map[int32][]int64
}

func (l *batchLog) onBatch(partition int32, next int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nexts == nil {
		l.nexts = map[int32][]int64{}
	}
	l.nexts[partition] = append(l.nexts[partition], next)
}

func (l *batchLog) of(partition int32) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nexts[partition]
}

// sendSession publishes n prompts of one session (so one partition) and
// returns that partition.
func (b *testBundle) sendSession(t *testing.T, session string, n int) int32 {
	t.Helper()
	var partition int32
	for i := range n {
		p := prompt(session, fmt.Sprintf("prompt %d", i))
		partition, _ = b.sendRaw(t, "prompts", p.SessionID, value(t, p), time.Time{})
	}
	return partition
}

// runWithin replays the whole topic and fails the test unless the replay
// completes before the deadline.
func (b *testBundle) runWithin(t *testing.T, cfg replay.Config, d time.Duration) *replay.Report {
	t.Helper()
	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	rep, err := b.replayer(t, b.pool, cfg).Run(ctx, "prompts", ranges)
	require.NoError(t, err)
	require.True(t, rep.Complete, "the replay did not finish within %s: %+v", d, rep.Partitions)
	return rep
}

func partitionReport(t *testing.T, rep *replay.Report, partition int32) replay.PartitionReport {
	t.Helper()
	for _, p := range rep.Partitions {
		if p.Partition == partition {
			return p
		}
	}
	t.Fatalf("no report of partition %d", partition)
	return replay.PartitionReport{}
}

// TestReplayBatches: a partition is admitted in batches of up to
// --max-batch messages (one transaction each, docs/replay.md), and a
// range ends as soon as its last message is in, however long a batch may
// wait to fill up.
func TestReplayBatches(t *testing.T) {
	t.Parallel()

	// A linger far longer than the test: a batch ends only when it is
	// full or when the range is exhausted.
	const linger = time.Hour

	t.Run("RangeSmallerThanMaxBatchIsOneBatchAndEndsAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		partition := b.sendSession(t, "s-one-batch", 5)
		var log batchLog
		rep := b.runWithin(t, replay.Config{MaxBatch: 10, Linger: linger, OnBatchFunc: log.onBatch}, 30*time.Second)
		require.Equal(t, []int64{5}, log.of(partition), "one batch, after which the next offset is 5")
		p := partitionReport(t, rep, partition)
		require.Equal(t, int64(5), p.Admitted)
		require.Equal(t, int64(0), p.First)
		require.Equal(t, int64(4), p.Last)
		require.Equal(t, int64(5), p.Next)
	})

	t.Run("FullBatchesThenTheRest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		partition := b.sendSession(t, "s-batches", 5)
		var log batchLog
		rep := b.runWithin(t, replay.Config{MaxBatch: 2, Linger: linger, OnBatchFunc: log.onBatch}, 30*time.Second)
		require.Equal(t, []int64{2, 4, 5}, log.of(partition))
		p := partitionReport(t, rep, partition)
		require.Equal(t, int64(5), p.Admitted)
		require.Equal(t, int64(0), p.First, "the first offset replayed in the run, not that of its last batch")
		require.Equal(t, int64(4), p.Last)
		require.Equal(t, int64(5), p.Next)
	})

	// By count alone, a thousand prompts of a megabyte were one
	// transaction of a gigabyte, which failed at the statement timeout on
	// every retry: the replay never ended. A batch also ends once its
	// values reach MaxBatchBytes (the message that reaches it included).
	t.Run("BatchesBoundedByBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		partition := b.sendSession(t, "s-bytes", 5)
		size := len(value(t, prompt("s-bytes", "prompt 0")))
		var log batchLog
		rep := b.runWithin(t, replay.Config{MaxBatchBytes: 2*size - 1, Linger: linger, OnBatchFunc: log.onBatch}, 30*time.Second)
		require.Equal(t, []int64{2, 4, 5}, log.of(partition), "two messages reach the bound (%d bytes each)", size)
		require.Equal(t, int64(5), rep.Totals.Admitted)
	})

	t.Run("RateShrinksBatchesToATenthOfIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		partition := b.sendSession(t, "s-rate", 6)
		var log batchLog
		// 20 messages per second: batches of 2 (the default --max-batch
		// is 1000).
		rep := b.runWithin(t, replay.Config{Rate: 20, Linger: linger, OnBatchFunc: log.onBatch}, 30*time.Second)
		require.Equal(t, []int64{2, 4, 6}, log.of(partition))
		require.Equal(t, int64(6), rep.Totals.Admitted)
	})
}
