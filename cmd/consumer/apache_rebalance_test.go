//go:build apachekafka

package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestApacheRebalances runs three consumers in one group on Apache Kafka
// under a steady load of prompts and makes members leave and join: a
// graceful stop (SIGTERM) and a newcomer, a SIGKILL, and a SIGSTOP past
// the session timeout (10s) followed by SIGCONT (a zombie that comes
// back). Through every generation each acknowledged prompt is admitted
// once and answered by one turn and one assistant message (the claim's
// fencing token keeps one writer per session, whoever owns the
// partition), and every partition a leaving member held is admitted on
// again by another member. The time from each departure to the last of its
// partitions admitting again is logged for docs/reliability.md.
func TestApacheRebalances(t *testing.T) {
	b, k := apacheSetup(t, 1)
	flags := []string{"--lease", "2s", "--recovery-interval", "500ms", "--redrive-after", "3s"}
	var members []*proc
	startMember := func(name string) *proc {
		p := b.start(t, name, "", flags...)
		p.waitLog(t, "consumer running", 3*time.Minute)
		members = append(members, p)
		return p
	}
	for i := range 3 {
		startMember(fmt.Sprintf("consumer-%d", i+1))
	}
	r := b.connectClients(t, k)
	awaitShared(t, members)

	load := startLoad(t, b.producer, "s-rb", 12, 100*time.Millisecond)
	load.waitSent(t, 30, 2*time.Minute)

	// owned is the prompts partitions of p's latest assignment.
	owned := func(p *proc) []int32 {
		line := lastLog(p.stderr.String(), "partitions assigned")
		require.NotNil(t, line, "%s has an assignment", p.name)
		claims, _ := line["claims"].(map[string]any)
		parts, _ := claims["prompts"].([]any)
		var out []int32
		for _, x := range parts {
			out = append(out, int32(x.(float64)))
		}
		return out
	}
	// readmitted waits until each of parts has an admission after since
	// and returns the time to the last of them.
	readmitted := func(what string, parts []int32, since time.Time) time.Duration {
		var worst time.Duration
		for _, p := range parts {
			var first time.Duration
			require.Eventually(t, func() bool {
				first = firstAfter(b.admissionsSince(t, []int32{p}, since), since)
				return first >= 0
			}, 3*time.Minute, 50*time.Millisecond, "%s: partition %d admitted again", what, p)
			worst = max(worst, first)
		}
		t.Logf("REBALANCE %s: partitions %v admitted again %s after", what, parts, worst.Round(time.Millisecond))
		return worst
	}

	// Graceful stop, then a newcomer.
	c1 := members[0]
	parts := owned(c1)
	at := time.Now()
	st := c1.stop(t)
	require.True(t, st.Success(), "SIGTERM stops %s cleanly: %s", c1.name, st)
	readmitted("SIGTERM of "+c1.name, parts, at)
	load.waitSent(t, 20, 2*time.Minute)
	joinAt := time.Now()
	c4 := startMember("consumer-4")
	awaitShared(t, []*proc{members[1], members[2], c4})
	t.Logf("REBALANCE join of %s: sharing the partitions %s after its start", c4.name, time.Since(joinAt).Round(time.Millisecond))
	load.waitSent(t, 20, 2*time.Minute)

	// SIGKILL.
	c2 := members[1]
	parts = owned(c2)
	at = time.Now()
	require.NoError(t, c2.cmd.Process.Kill())
	requireKilled(t, c2.waitExit(t, 30*time.Second))
	readmitted("SIGKILL of "+c2.name, parts, at)
	load.waitSent(t, 20, 2*time.Minute)

	// SIGSTOP past the session timeout, then SIGCONT: the zombie's
	// partitions move, and its executions, if any were running, are fenced
	// by their claims when it resumes.
	c3 := members[2]
	parts = owned(c3)
	at = time.Now()
	require.NoError(t, c3.cmd.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = c3.cmd.Process.Signal(syscall.SIGCONT) })
	readmitted("SIGSTOP of "+c3.name, parts, at)
	// The pause's length, not a synchronisation: past the session timeout.
	if d := 15*time.Second - time.Since(at); d > 0 {
		<-time.After(d)
	}
	require.NoError(t, c3.cmd.Process.Signal(syscall.SIGCONT))
	contAt := time.Now()
	awaitShared(t, []*proc{c3, c4})
	t.Logf("REBALANCE SIGCONT of %s after %s: sharing again %s later", c3.name, contAt.Sub(at).Round(time.Millisecond), time.Since(contAt).Round(time.Millisecond))
	load.waitSent(t, 30, 2*time.Minute)

	// Every partition is admitted on after the last rebalance.
	last := time.Now()
	load.waitSent(t, 20, 2*time.Minute)
	readmitted("after the last rebalance, every", []int32{0, 1, 2, 3}, last)
	load.halt()
	all, sendErrs := load.snapshot()
	completed, reconciled := b.requireSingleWriter(t, r, all)
	t.Logf("%d prompts acknowledged (%d sends retried), %d completed, %d reconciled as outcome unknown", len(all), sendErrs, completed, reconciled)
	t.Logf("%s fenced writes: %v", c3.name, findLog(c3.stderr.String(), "execution fenced: claim lost, stopping") != nil)
}

// awaitShared waits until the members' latest assignments are of one
// generation and each holds prompts partitions.
func awaitShared(t *testing.T, members []*proc) {
	t.Helper()
	require.Eventually(t, func() bool {
		gens := map[float64]bool{}
		for _, c := range members {
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
	}, 3*time.Minute, 50*time.Millisecond, "the members sharing the partitions")
}
