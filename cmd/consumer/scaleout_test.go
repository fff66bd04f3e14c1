package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
)

// TestScaleOutKillOne runs three consumers in one group, sharing the
// partitions, and kills one with SIGKILL while prompts are still arriving.
// The survivors take its partitions over (rebalance) and recovery, running
// every 300ms, takes over its expired claims: every prompt is admitted
// once and answered by exactly one turn (completed, or failed as
// outcome_unknown if the kill fell inside a provider attempt: reconciled,
// never replayed).
func TestScaleOutKillOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flags := []string{"--lease", "1s", "--recovery-interval", "300ms", "--redrive-after", "2s"}
	consumers := make([]*proc, 3)
	for i := range consumers {
		consumers[i] = b.start(t, fmt.Sprintf("consumer-%d", i+1), "", flags...)
	}
	// The three share the partitions: each one's latest assignment, of
	// one generation, holds prompts partitions.
	require.Eventually(t, func() bool {
		gens := map[float64]bool{}
		for _, c := range consumers {
			line := lastLog(c.stderr.String(), "partitions assigned")
			if line == nil {
				return false
			}
			claims, _ := line["claims"].(map[string]any)
			if parts, _ := claims["prompts"].([]any); len(parts) == 0 {
				return false
			}
			gen, _ := line["generation"].(float64)
			gens[gen] = true
		}
		return len(gens) == 1
	}, 60*time.Second, 50*time.Millisecond, "three consumers sharing the partitions")

	const sessions, perSession = 24, 5
	var prompts []envelope.Prompt
	for round := range perSession {
		for s := range sessions {
			prompts = append(prompts, prompt(fmt.Sprintf("s-scale-%d", s), fmt.Sprintf("round %d", round)))
		}
	}
	half := len(prompts) / 2

	// The first half, then the kill once some of it has been answered,
	// while the second half is being sent.
	for _, p := range prompts[:half] {
		b.send(t, p)
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, p := range prompts[:half] {
			if len(b.events.turnEvents(t, p.MessageID)) > 0 {
				n++
			}
		}
		return n >= half/4
	}, 60*time.Second, 20*time.Millisecond, "turns of the first half")
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, p := range prompts[half:] {
			b.send(t, p)
		}
	})
	require.NoError(t, consumers[1].cmd.Process.Kill())
	requireKilled(t, consumers[1].waitExit(t, 10*time.Second))
	wg.Wait()

	for _, p := range prompts {
		b.events.waitTurn(t, p.MessageID)
	}
	completed, failed := 0, 0
	for _, p := range prompts {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, p.MessageID), "one input for %s", p.MessageID)
		turns := b.events.turnEvents(t, p.MessageID)
		require.Equal(t, 1, distinctIDs(turns), "one turn for %s: %v", p.MessageID, turns)
		require.Equal(t, 1, b.count(t, assistantAnswering, p.MessageID), "one answer to %s", p.MessageID)
		switch turns[0].Type {
		case envelope.EventTurnCompleted:
			completed++
		default:
			require.Equal(t, envelope.FailOutcomeUnknown, turns[0].Reason, "a failed turn can only be a reconciled one")
			failed++
		}
	}
	require.Equal(t, len(prompts), b.count(t, `SELECT count(*) FROM inputs WHERE session_id LIKE 's-scale-%'`), "no extra input")
	t.Logf("%d prompts: %d completed, %d reconciled as outcome unknown", len(prompts), completed, failed)
}

// lastLog returns the last JSON line of logs whose msg is msg.
func lastLog(logs, msg string) map[string]any {
	var last map[string]any
	for l := range strings.Lines(logs) {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) == nil && line["msg"] == msg {
			last = line
		}
	}
	return last
}
