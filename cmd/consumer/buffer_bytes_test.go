package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// A backlog of large prompts on one partition (after an outage; agents
// paste large contexts) must not take more of the consumer's memory than
// --buffer-bytes bounds. Sarama's channel counted 1024 messages per owned
// partition whatever their size: 1 MB prompts waiting for admission held
// hundreds of MB, and a consumer under a memory limit was killed at every
// restart by the same backlog, its partitions stopped for good. The broker
// runs in this test process, so the consumer's peak RSS (VmHWM) counts
// only what the consumer holds; under -race the consumer runs
// uninstrumented (measuredBin), so the bound is the same in both suites.
func TestLargePromptBacklogStaysWithinTheBufferBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		prompts   = 500
		textBytes = 1_000_000
	)
	t0 := time.Now()
	sendBacklog(t, b, prompts, textBytes)
	t.Logf("backlog sent in %v", time.Since(t0).Round(time.Millisecond))

	// One session at a time: the executor's turns hold one prompt's
	// history, not the backlog's.
	t0 = time.Now()
	c := b.startMeasured(t, "c1", "--max-sessions", "1")
	admitted := 0
	assert.Eventually(t, func() bool {
		admitted = b.count(t, `SELECT count(*) FROM inputs`)
		return admitted == prompts
	}, 5*time.Minute, 50*time.Millisecond)
	require.Equal(t, prompts, admitted, "every prompt of the backlog admitted")
	t.Logf("backlog admitted in %v", time.Since(t0).Round(time.Millisecond))
	hwm := vmHWM(t, c.cmd.Process.Pid)

	// What the consumer may hold at most: --buffer-bytes (default) of
	// values, half in Sarama's channel and half in admission's queue and
	// batch, the fetch being fed to the channel (1 MiB, one value here)
	// and two admission batches of 16 MiB of prompts (one written, one
	// taken, counted again for other partitions' batches combined); each
	// value byte costs up to four of RSS (the value, its
	// decoded text, the driver's wire buffer, and the headroom of the Go
	// collector, which lets the heap reach twice what is live), plus the
	// process's own 128 MiB (executor, relay, pools, runtime; measured:
	// 124 MiB with a channel of one message). The old channel of 1024
	// messages held the whole backlog: 1068 MiB.
	live := kafkautil.BufferBytesDefault + 1<<20 + 2*16<<20
	bound := int64(4*live + 128<<20)
	t.Logf("consumer peak RSS %d MiB, bound %d MiB", hwm>>20, bound>>20)
	require.Less(t, hwm, bound, "peak RSS of the consumer under a backlog of %d prompts of %d bytes", prompts, textBytes)
}

// sendBacklog sends n prompts of textBytes random letters, each to a
// session of its own whose key lands on partition 0 of prompts: one
// partition's channel holds the backlog. Random letters: Postgres cannot
// compress them away, so admission writes every byte and the backlog
// waits for it.
func sendBacklog(t *testing.T, b *testBundle, n, textBytes int) {
	t.Helper()
	part := kafkautil.NewMurmur2Partitioner("prompts")
	var sessions []string
	for i := 0; len(sessions) < n; i++ {
		s := fmt.Sprintf("s-backlog-%d", i)
		p, err := part.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(s)}, testPartitions)
		require.NoError(t, err)
		if p == 0 {
			sessions = append(sessions, s)
		}
	}
	// Each prompt is a window of one pool of twice the size, at its own
	// offset: as incompressible as a prompt drawn letter by letter (pglz
	// compresses within a value), and 250 times fewer draws, which under
	// -race took most of the test's time.
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 2*textBytes)
	for j := range pool {
		pool[j] = byte('a' + rng.IntN(26))
	}
	for i, s := range sessions {
		off := i * 7919 % textBytes
		b.send(t, envelope.Prompt{MessageID: "m-backlog-" + strconv.Itoa(i), SessionID: s, Text: string(pool[off : off+textBytes])})
	}
}

// vmHWM is the peak resident set size of a process, from /proc.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	hwm, err := readVmHWM(pid)
	require.NoError(t, err)
	return hwm
}

// readVmHWM is vmHWM's reading, an error when the process has gone (a
// zombie's status has no VmHWM).
func readVmHWM(pid int) (int64, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(st)) {
		rest, ok := strings.CutPrefix(l, "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmHWM: %q", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmHWM: %w", err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmHWM in /proc status:\n%s", st)
}
