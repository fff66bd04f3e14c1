package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// TestKcatEndToEnd drives the running consumer with librdkafka's kcat
// only: kcat publishes two envelopes (with the murmur2 partitioner that
// docs/producers.md asks non-Java producers for) and reads both answers
// back from session-events.
func TestKcatEndToEnd(t *testing.T) {
	testkit.SkipInShortTier(t, "kcat")
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	require.NoError(t, err, "the end-to-end test needs kcat (librdkafka): apt-get install kcat")
	b := setup(t)
	b.start(t, "consumer", "")

	prompts := []envelope.Prompt{prompt("s-kcat-1", "hello from kcat"), prompt("s-kcat-2", "and again")}
	var in strings.Builder
	for _, p := range prompts {
		v, err := envelope.Marshal(p)
		require.NoError(t, err)
		require.NotContains(t, string(v), "\n")
		in.WriteString(p.SessionID + "|" + string(v) + "\n")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	produce := exec.CommandContext(ctx, kcat, "-P", "-b", b.addr, "-t", "prompts", "-K", "|", "-X", "partitioner=murmur2_random")
	produce.Stdin = strings.NewReader(in.String())
	out, err := produce.CombinedOutput()
	require.NoError(t, err, "kcat -P: %s", out)

	var last string
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, kcat, "-C", "-b", b.addr, "-t", "session-events",
			"-o", "beginning", "-e", "-q", "-f", "%k\t%s\n").Output()
		if err != nil {
			last = err.Error()
			return false
		}
		last = string(out)
		answered := map[string]string{}
		for line := range strings.Lines(last) {
			key, value, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
			require.True(t, ok, "kcat printed %q", line)
			e, err := envelope.DecodeEvent([]byte(value))
			require.NoError(t, err, "kcat read %q", value)
			require.Equal(t, e.SessionID, key)
			if e.Type == envelope.EventTurnCompleted && len(e.MessageIDs) == 1 {
				answered[e.MessageIDs[0]] = e.Text
			}
		}
		for _, p := range prompts {
			if text, ok := answered[p.MessageID]; !ok || text != "echo: "+p.Text {
				return false
			}
		}
		return true
	}, 40*time.Second, 250*time.Millisecond, "kcat did not read both turn.completed events")
	t.Logf("kcat read session-events:\n%s", last)
}
