package main

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// replayStopArgs is a replay whose batch's rejects cannot be published:
// its rejects topic does not exist (the embedded broker creates no topic
// on demand), so the publish is retried as for a broker away.
var replayStopArgs = []string{"--publish-rejects", "--rejects-topic", "late.rejects", "--max-batch", "10", "--json"}

// startStuckReplay sends a prompt and a malformed message, starts a
// replay of them and waits until its batch's admission committed and
// the publish of its reject is being retried.
func (b *testBundle) startStuckReplay(t *testing.T, extra ...string) *replayRun {
	t.Helper()
	b.send(t, prompt("s-stop", "fresh"))
	b.sendRaw(t, "s-stop", []byte(`{"message_id":`))
	r := b.startReplay(t, append(replayStopArgs, extra...)...)
	waitStderr(t, r, "publishing rejects failed; retrying", 60*time.Second)
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM inputs"), "the batch's admission committed")
	return r
}

func waitStderr(t *testing.T, r *replayRun, s string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for !strings.Contains(r.stderr.String(), s) {
		select {
		case <-r.stderr.Changed():
		case <-r.exited:
			require.FailNow(t, "replay exited before logging "+s, r.stderr.String())
		case <-deadline:
			require.FailNow(t, "replay did not log "+s, r.stderr.String())
		}
	}
}

func exitStatus(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exited by itself: %v", err)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Exited(), "exited by itself, not killed: %v", err)
	return ws.ExitStatus()
}

// The first SIGINT of a replay is a graceful stop with a bounded wait
// (STYLE, Lifecycle; docs/replay.md): the batch whose admission committed
// gets --stop-grace for its rejects, then the stop gives up on them. The
// batch is not counted (the resumed run reports its prompts duplicate and
// publishes its rejects again), the report and the resume offsets are
// written, and the command exits non-zero. Before, the first SIGINT waited
// for the rejects topic for as long as it stayed away: only a second
// SIGINT ended the command, without a report or a resume file.
func TestReplayFirstSIGINTGivesUpOnRejectsAfterTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.startStuckReplay(t, "--stop-grace", "2s")

	sent := time.Now()
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGINT))
	var err error
	select {
	case <-r.exited:
		err = r.err
	case <-time.After(30 * time.Second):
		require.FailNow(t, "a stopped replay was still waiting for its rejects 30s after SIGINT (--stop-grace 2s)", r.stderr.String())
	}
	took := time.Since(sent)
	t.Logf("replay exited %s after SIGINT", took.Round(time.Millisecond))
	require.GreaterOrEqual(t, took, 2*time.Second, "the rejects were given the grace")
	require.Equal(t, 1, exitStatus(t, err), "an interrupted replay exits non-zero")
	require.Contains(t, r.stderr.String(), "the stop's grace (--stop-grace 2s) ended")
	require.Contains(t, r.stderr.String(), "resume from offsets")
	rep := decodeReport(t, r.stdout.String())
	require.True(t, rep.Interrupted)
	require.Zero(t, rep.Totals.Messages, "the batch whose rejects were not published is not counted")
	for _, p := range rep.Partitions {
		require.Equal(t, p.From, p.Next, "partition %d resumes at the batch", p.Partition)
	}
}

// A second SIGINT during the grace exits at once (exit status 130): the
// operator's way to end a stop that waits.
func TestReplaySecondSIGINTExitsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.startStuckReplay(t, "--stop-grace", "10m")

	require.NoError(t, r.cmd.Process.Signal(syscall.SIGINT))
	// Once the first is handled: two pending at once would merge into one.
	waitStderr(t, r, "the stop waits for the rejects", 30*time.Second)
	sent := time.Now()
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGINT))
	select {
	case <-r.exited:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "a second SIGINT did not end the replay", r.stderr.String())
	}
	t.Logf("replay exited %s after the second SIGINT", time.Since(sent).Round(time.Millisecond))
	require.Equal(t, 130, exitStatus(t, r.err))
	require.Contains(t, r.stderr.String(), "consumer: second signal, exiting at once")
}
