package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// kcatPath finds kcat (librdkafka's command-line client). Interop with
// librdkafka is part of the contract, so a missing kcat fails the test.
func kcatPath(t *testing.T) string {
	t.Helper()
	testkit.SkipInShortTier(t, "kcat")
	path, err := exec.LookPath("kcat")
	require.NoError(t, err, "the interop test needs kcat (librdkafka): apt-get install kcat")
	return path
}

// TestKcatInterop checks that librdkafka's murmur2_random partitioner, the
// one docs/producers.md tells non-Java producers to set, and the Go
// producer put every session on the same partition, and that records cross
// between the two clients intact.
func TestKcatInterop(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)

	const partitions = 8
	addr := testkit.Broker(t, partitions).Addr()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	// "21" hashes to a negative Java int: it tells masking the sign bit
	// (Java, librdkafka) from taking the absolute value.
	sessions := []string{"s-1", "s-2", "21", "abc", "foobar", "session-with-a-longer-id", "0196a7c2-7b1e-7d4a-9c1e-1f2e3d4c5b6a", "x"}

	// kcat publishes one envelope per session: "KEY:VALUE" lines, split at
	// the first colon.
	var in strings.Builder
	for _, s := range sessions {
		in.WriteString(s + ":" + envelopeLine(t, envelope.Prompt{MessageID: "kcat-" + s, SessionID: s, Text: "from kcat: " + s}) + "\n")
	}
	produce := exec.CommandContext(ctx, kcat, "-P", "-b", addr, "-t", "prompts", "-K", ":", "-X", "partitioner=murmur2_random")
	produce.Stdin = strings.NewReader(in.String())
	out, err := produce.CombinedOutput()
	require.NoError(t, err, "kcat -P: %s", out)

	kcatPartition := map[string]int32{}
	for _, m := range testkit.ReadAll(t, addr, "prompts") {
		p, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
		require.NoError(t, err, "a kcat record decodes as admission decodes it")
		require.Equal(t, "kcat-"+p.SessionID, p.MessageID)
		kcatPartition[p.SessionID] = m.Partition
	}
	require.Len(t, kcatPartition, len(sessions))

	spread := map[int32]bool{}
	for _, s := range sessions {
		res := runCLI(ctx, "", "send", "--brokers", addr, "--session", s, "--text", "from Go: "+s, "--message-id", "go-"+s)
		require.NoError(t, res.err, res.stderr)
		_, partition, _, _ := sent(t, res.stdout)
		require.Equal(t, kcatPartition[s], partition, "session %q: kcat (murmur2_random) and the Go producer must agree", s)
		require.Equal(t, kafkautil.Murmur2Partition([]byte(s), partitions), partition, "session %q", s)
		spread[partition] = true
	}
	require.Greater(t, len(spread), 1, "the sessions must exercise more than one partition")

	// And back: kcat reads what the Go producer wrote, key and partition
	// included.
	consume := exec.CommandContext(ctx, kcat, "-C", "-b", addr, "-t", "prompts", "-e", "-q", "-f", "%k\t%p\t%s\n")
	out, err = consume.Output()
	require.NoError(t, err, "kcat -C")
	fromGo := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.SplitN(strings.TrimSuffix(line, "\n"), "\t", 3)
		require.Len(t, fields, 3, "kcat printed %q", line)
		p, err := envelope.Decode([]byte(fields[0]), []byte(fields[2]), envelope.Limits{})
		require.NoError(t, err, line)
		if !strings.HasPrefix(p.MessageID, "go-") {
			continue
		}
		fromGo++
		part, err := strconv.ParseInt(fields[1], 10, 32)
		require.NoError(t, err)
		require.Equal(t, kcatPartition[p.SessionID], int32(part), fmt.Sprintf("session %q", p.SessionID))
	}
	require.Equal(t, len(sessions), fromGo)
}
