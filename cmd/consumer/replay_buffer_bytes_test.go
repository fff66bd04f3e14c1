package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// A replay over a backlog of large prompts must hold no more of them than
// --buffer-bytes per partition. Replay reads every partition of its range
// at once, and Sarama's channel of each held 1024 messages whatever their
// size: with prompts of 1 MB a partition took about 1 GiB, a replay under a
// memory limit was killed, and killed again at every rerun, never ending.
// The broker runs in this test process, so the replay's peak RSS (VmHWM)
// counts only what replay holds; under -race the replay runs uninstrumented
// (measuredBin), so the bound is the same in both suites.
func TestReplayOfLargePromptsStaysWithinTheBufferBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		prompts   = 500
		textBytes = 1_000_000
	)
	sendBacklog(t, b, prompts, textBytes)

	bin, err := measuredBin()
	require.NoError(t, err)
	r := b.startReplayBin(t, bin, "--partitions", "0")
	// VmHWM, read until the process exits: the peak of its own memory.
	// (Its rusage's peak would not do: the test process forks it, and
	// Linux counts the parent's resident set, the broker's backlog, in the
	// child's peak up to its exec.)
	var hwm int64
	deadline := time.After(5 * time.Minute)
sample:
	for {
		if v, err := readVmHWM(r.cmd.Process.Pid); err == nil {
			hwm = max(hwm, v)
		}
		select {
		case <-r.exited:
			break sample
		case <-deadline:
			require.FailNow(t, "replay of the backlog still running after 5 minutes", r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.NoError(t, r.err, r.stderr.String())
	require.Equal(t, prompts, b.count(t, `SELECT count(*) FROM inputs`), "every prompt of the backlog admitted")
	require.Positive(t, hwm, "no VmHWM read while the replay ran")

	// What replay may hold of one partition at most: its channel of
	// --buffer-bytes (default) counted at --max-value-bytes, the fetch
	// being fed to the channel (1 MiB, one value here) and the batch being
	// admitted (16 MiB). Each value byte costs up to four of RSS (the
	// value, its decoded text, the driver's wire buffer, and the headroom
	// of the Go collector, which lets the heap reach twice what is live),
	// plus the process's own: measured 131-142 MiB with a channel of one
	// message (--buffer-bytes 1), allowed twice that, 288 MiB, as the
	// collector's headroom applies to it too (with 160 MiB the runs here
	// peaked at 288-317 MiB of a 356 MiB bound: too close to hold on a
	// busier machine). The old channel of 1024 messages held the whole
	// backlog: 1003-1014 MiB, still twice the bound.
	live := kafkautil.BufferBytesDefault + 1<<20 + 16<<20
	bound := int64(4*live + 288<<20)
	t.Logf("replay peak RSS %d MiB, bound %d MiB", hwm>>20, bound>>20)
	require.Less(t, hwm, bound, "peak RSS of a replay of %d prompts of %d bytes on one partition", prompts, textBytes)
}
