package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/replay"
)

// replayRun is one `consumer replay` process, its stdout (the report) kept
// apart from its stderr (logs and progress).
type replayRun struct {
	cmd    *exec.Cmd
	stdout *testkit.SyncBuffer
	stderr *testkit.SyncBuffer
	exited chan struct{}
	err    error
}

func (b *testBundle) startReplay(t *testing.T, args ...string) *replayRun {
	t.Helper()
	return b.startReplayBin(t, consumerBin, args...)
}

// startReplayBin is startReplay with the binary to run.
func (b *testBundle) startReplayBin(t *testing.T, bin string, args ...string) *replayRun {
	t.Helper()
	r := &replayRun{stdout: testkit.NewSyncBuffer(), stderr: testkit.NewSyncBuffer(), exited: make(chan struct{})}
	all := append([]string{"consumer", "replay", "--brokers", b.addr, "--database-url", b.dbURL, "--log-level", "warn"}, args...)
	r.cmd = &exec.Cmd{Path: bin, Args: all, Env: os.Environ(), Stdout: r.stdout, Stderr: r.stderr}
	require.NoError(t, r.cmd.Start())
	go func() {
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-r.exited:
		default:
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
		t.Logf("replay %v stderr:\n%s", args, r.stderr.String())
	})
	return r
}

func (r *replayRun) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.exited:
		return r.err
	case <-time.After(60 * time.Second):
		require.FailNow(t, "replay still running after 60s", r.stderr.String())
		return nil
	}
}

// replayJSON runs a replay to its end and returns its JSON report.
func (b *testBundle) replayJSON(t *testing.T, args ...string) *replay.Report {
	t.Helper()
	r := b.startReplay(t, append(args, "--json")...)
	require.NoError(t, r.wait(t), r.stderr.String())
	return decodeReport(t, r.stdout.String())
}

func decodeReport(t *testing.T, s string) *replay.Report {
	t.Helper()
	var rep replay.Report
	require.NoError(t, json.Unmarshal([]byte(s), &rep), "report: %s", s)
	return &rep
}

func queued(session, text string) envelope.Prompt {
	p := prompt(session, text)
	p.Delivery = envelope.DeliveryQueue
	return p
}

func (b *testBundle) sendRaw(t *testing.T, key string, value []byte) {
	t.Helper()
	_, _, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(value)})
	require.NoError(t, err)
}

func (b *testBundle) tableCounts(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"inputs", "sessions", "outbox", "messages", "claims"} {
		out[table] = b.count(t, "SELECT count(*) FROM "+table)
	}
	return out
}

func TestReplayCommand(t *testing.T) {
	t.Parallel()

	t.Run("ReportRowsAndDryRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var fresh, dup []envelope.Prompt
		for i := range 5 {
			fresh = append(fresh, queued(fmt.Sprintf("s-f%d", i%2), fmt.Sprintf("fresh %d", i)))
		}
		for i := range 3 {
			dup = append(dup, queued(fmt.Sprintf("s-d%d", i), fmt.Sprintf("dup %d", i)))
		}
		orig := queued("s-c", "original")
		conflict := orig
		conflict.Text = "reused id, other text"
		var pre []admission.Incoming
		for _, p := range append(dup, orig) {
			pre = append(pre, admission.Incoming{Prompt: p})
		}
		_, err := admission.NewAdmitter(b.pool, &admission.AdmitterConfig{}).Admit(t.Context(), pre)
		require.NoError(t, err)
		for _, p := range append(append(fresh, dup...), conflict) {
			b.send(t, p)
		}
		b.sendRaw(t, "s-m", []byte(`{"message_id":"m-1","session_id":"s-m"}`))
		b.sendRaw(t, "s-m", []byte{0xff, 0xfe})

		// A dry run classifies and writes nothing.
		before := b.tableCounts(t)
		dry := b.replayJSON(t, "--dry-run")
		require.True(t, dry.DryRun)
		require.Equal(t, before, b.tableCounts(t), "--dry-run writes nothing")

		rep := b.replayJSON(t)
		require.True(t, rep.Complete)
		require.Equal(t, int64(11), rep.Totals.Messages)
		require.Equal(t, int64(5), rep.Totals.Admitted)
		require.Equal(t, int64(3), rep.Totals.Duplicate)
		require.Equal(t, int64(1), rep.Totals.Conflict)
		require.Equal(t, int64(2), rep.Totals.Malformed)
		require.Equal(t, map[string]int64{"conflict": 1, "missing_field": 1, "invalid_utf8": 1}, rep.Reasons)
		dry.Totals.Bytes, rep.Totals.Bytes = 0, 0
		require.Equal(t, rep.Totals, dry.Totals, "the dry run classified as the real run")
		require.Len(t, rep.Partitions, testPartitions)
		for _, p := range rep.Partitions {
			require.Equal(t, p.To, p.Next)
		}
		require.Equal(t, before["inputs"]+5, b.count(t, "SELECT count(*) FROM inputs"))
		require.Zero(t, b.count(t, "SELECT count(*) FROM inputs WHERE wake_pending AND source_topic = 'prompts'"), "no --wake: no wake armed")
		require.Equal(t, 1, b.count(t, "SELECT count(*) FROM inputs WHERE message_id = $1 AND text = 'original'", orig.MessageID))

		// A second identical replay admits nothing.
		rows := b.tableCounts(t)
		again := b.replayJSON(t)
		require.Zero(t, again.Totals.Admitted)
		require.Equal(t, int64(8), again.Totals.Duplicate)
		require.Equal(t, rows, b.tableCounts(t))

		// The text report says the same.
		r := b.startReplay(t, "--partitions", "0,1,2,3")
		require.NoError(t, r.wait(t))
		require.Contains(t, r.stdout.String(), "admitted 0, duplicate 8, conflict 1, malformed 2")
	})

	// A dry run admits nothing, so it must not move a resume file: the real
	// run after it would start at the end and replay nothing.
	t.Run("DryRunLeavesTheResumeFileAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 6 {
			b.send(t, queued(fmt.Sprintf("s-%d", i%3), fmt.Sprintf("prompt %d", i)))
		}
		resume := filepath.Join(t.TempDir(), "resume.json")
		dry := b.replayJSON(t, "--dry-run", "--resume-file", resume)
		require.Equal(t, int64(6), dry.Totals.Admitted)
		_, err := os.Stat(resume)
		require.ErrorIs(t, err, os.ErrNotExist, "a dry run writes no resume file")
		require.Zero(t, b.count(t, "SELECT count(*) FROM inputs"))

		// An existing one is read, and left as it was.
		client, err := sarama.NewClient([]string{b.addr}, kafkautil.NewConfig("replay-test"))
		require.NoError(t, err)
		defer client.Close()
		ranges, err := replay.Resolve(client, "prompts", replay.Bounds{})
		require.NoError(t, err)
		require.NoError(t, replay.SaveResume(resume, replay.ResumeState{Topic: "prompts", Ranges: ranges}))
		before, err := os.ReadFile(resume)
		require.NoError(t, err)
		dry = b.replayJSON(t, "--dry-run", "--resume-file", resume)
		require.Equal(t, int64(6), dry.Totals.Admitted)
		after, err := os.ReadFile(resume)
		require.NoError(t, err)
		require.Equal(t, string(before), string(after))

		real := b.replayJSON(t, "--resume-file", resume)
		require.Equal(t, int64(6), real.Totals.Admitted, "the real run replays the whole range")
		require.Equal(t, 6, b.count(t, "SELECT count(*) FROM inputs"))
	})

	t.Run("InterruptAndResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 300
		for i := range n {
			b.send(t, queued(fmt.Sprintf("s-%d", i%13), fmt.Sprintf("prompt %d", i)))
		}
		resume := filepath.Join(t.TempDir(), "resume.json")
		r := b.startReplay(t, "--rate", "150", "--progress-interval", "50ms", "--resume-file", resume, "--json")
		progressed := regexp.MustCompile(`replay: ([1-9][0-9]*)/300 offsets`)
		deadline := time.After(30 * time.Second)
		for !progressed.MatchString(r.stderr.String()) {
			select {
			case <-r.stderr.Changed():
			case <-r.exited:
				require.FailNow(t, "replay ended before it was interrupted", r.stderr.String())
			case <-deadline:
				require.FailNow(t, "no progress line", r.stderr.String())
			}
		}
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGINT))
		err := r.wait(t)
		require.Error(t, err, "an interrupted replay exits non-zero")
		require.Contains(t, r.stderr.String(), "resume from offsets")
		first := decodeReport(t, r.stdout.String())
		require.True(t, first.Interrupted)
		require.Less(t, first.Totals.Messages, int64(n))
		st, ok, err := replay.LoadResume(resume)
		require.NoError(t, err)
		require.True(t, ok)
		for _, rg := range st.Ranges {
			for _, p := range first.Partitions {
				if p.Partition == rg.Partition {
					require.Equal(t, p.Next, rg.From)
				}
			}
		}
		require.Equal(t, int(first.Totals.Admitted), b.count(t, "SELECT count(*) FROM inputs"), "what the report counts is durable")

		second := b.replayJSON(t, "--resume-file", resume)
		require.True(t, second.Complete)
		require.Equal(t, int64(n), first.Totals.Messages+second.Totals.Messages, "the union covers the range once")
		require.Equal(t, int64(n), first.Totals.Admitted+second.Totals.Admitted)
		require.Zero(t, first.Totals.Duplicate+second.Totals.Duplicate)
		require.Equal(t, n, b.count(t, "SELECT count(*) FROM inputs"))

		// The resume file now says: done.
		done := b.replayJSON(t, "--resume-file", resume)
		require.Zero(t, done.Totals.Messages)
	})

	t.Run("ConcurrentWithLive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 40
		var ps []envelope.Prompt
		for i := range n {
			p := queued(fmt.Sprintf("s-live-%d", i%10), fmt.Sprintf("prompt %d", i))
			ps = append(ps, p)
			b.send(t, p)
		}
		b.start(t, "live", "")
		// --wake is the harder case: the replay may admit a prompt before
		// the live consumer does, and both ask for a wake.
		rep := b.replayJSON(t, "--wake")
		require.Equal(t, int64(n), rep.Totals.Admitted+rep.Totals.Duplicate)
		for _, p := range ps {
			b.events.waitTurn(t, p.MessageID)
		}
		require.Equal(t, n, b.count(t, "SELECT count(*) FROM inputs"))
		// Let the live path finish its own work, then count turns: every
		// input promoted once, one user message and one turn each.
		require.Eventually(t, func() bool {
			return b.count(t, "SELECT count(*) FROM inputs WHERE promotion_seq IS NULL") == 0 &&
				b.count(t, "SELECT count(*) FROM claims") == 0
		}, 30*time.Second, 20*time.Millisecond)
		require.Equal(t, n, b.count(t, "SELECT count(*) FROM messages WHERE role = 'user'"))
		for _, p := range ps {
			require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "one turn for %s", p.MessageID)
			require.Equal(t, 1, distinctIDs(b.events.admittedEvents(t, p.MessageID)), "one admission of %s", p.MessageID)
		}
		require.Equal(t, n, b.count(t, "SELECT count(*) FROM messages WHERE role = 'assistant'"))
	})

	t.Run("RejectsReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		big := queued("s-big", string(make([]byte, 0))+fmt.Sprintf("%0900d", 7))
		small := queued("s-small", "fits")
		b.start(t, "live", "", "--max-value-bytes", "500")
		b.send(t, big)
		b.send(t, small)
		b.sendRaw(t, "s-x", []byte(`{"message_id":"m-x","session_id":"s-x","text":"t","colour":"red"}`))
		b.events.waitTurn(t, small.MessageID)
		rejects := readTopic(t, b.addr, "prompts.rejects")
		require.Eventually(t, func() bool {
			return rejects.Len() == 2
		}, 30*time.Second, 20*time.Millisecond)

		rep := b.replayJSON(t, "--topic", "prompts.rejects", "--max-value-bytes", strconv.Itoa(4096))
		require.Equal(t, int64(1), rep.Totals.Admitted, "the too-large prompt fits the new limit")
		require.Equal(t, int64(1), rep.Totals.Malformed)
		require.Len(t, rep.Rejections, 1)
		require.Equal(t, envelope.ReasonUnknownField, rep.Rejections[0].Reason)
		require.Equal(t, envelope.ReasonUnknownField, rep.Rejections[0].OriginalReason)
		require.Equal(t, 1, b.count(t, "SELECT count(*) FROM inputs WHERE message_id = $1 AND source_topic = 'prompts'", big.MessageID))
		require.Zero(t, b.count(t, "SELECT count(*) FROM inputs WHERE message_id = $1 AND wake_pending", big.MessageID))
	})

	// --publish-rejects never publishes into the topic it reads, also when
	// that topic comes from a resume file rather than --topic: each run
	// would add its rejects to the rejects it replays.
	t.Run("PublishRejectsRefusedOnAResumedRejectsTopic", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, _, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts.rejects", Key: sarama.StringEncoder("s-x"),
			Value: sarama.StringEncoder("not json"), Headers: []sarama.RecordHeader{
				{Key: []byte("reason"), Value: []byte(envelope.ReasonInvalidJSON)}, {Key: []byte("source_topic"), Value: []byte("prompts")},
				{Key: []byte("source_partition"), Value: []byte("0")}, {Key: []byte("source_offset"), Value: []byte("0")}}})
		require.NoError(t, err)
		client, err := sarama.NewClient([]string{b.addr}, kafkautil.NewConfig("replay-test"))
		require.NoError(t, err)
		defer client.Close()
		rejectsHWM := func() int64 {
			var n int64
			for p := range int32(testPartitions) {
				hwm, err := client.GetOffset("prompts.rejects", p, sarama.OffsetNewest)
				require.NoError(t, err)
				n += hwm
			}
			return n
		}
		ranges, err := replay.Resolve(client, "prompts.rejects", replay.Bounds{})
		require.NoError(t, err)
		resume := filepath.Join(t.TempDir(), "resume.json")
		require.NoError(t, replay.SaveResume(resume, replay.ResumeState{Topic: "prompts.rejects", Ranges: ranges}))
		before := rejectsHWM()
		require.Equal(t, int64(1), before)

		r := b.startReplay(t, "--resume-file", resume, "--publish-rejects")
		require.Error(t, r.wait(t), "stdout:\n%s", r.stdout.String())
		require.Contains(t, r.stderr.String(), "--publish-rejects")
		require.Equal(t, before, rejectsHWM(), "nothing published into the topic replayed")
	})

	t.Run("BadFlags", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			args []string
			msg  string
		}{
			{[]string{"--from-offset", "x"}, "--from-offset"},
			{[]string{"--from-time", "yesterday"}, "--from-time"},
			{[]string{"--from-offset", "3", "--from-time", "2026-03-01T00:00:00Z"}, "exclude each other"},
			{[]string{"--dry-run", "--wake"}, "exclude each other"},
			{[]string{"--topic", "prompts.rejects", "--publish-rejects"}, "--publish-rejects"},
			{[]string{"--rate", "-1"}, "--rate"},
			{[]string{"--buffer-bytes", "0"}, "--buffer-bytes: must be at least 1"},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			out, err := exec.CommandContext(ctx, consumerBin, append([]string{"replay", "--brokers", "127.0.0.1:1"}, c.args...)...).CombinedOutput()
			cancel()
			require.Error(t, err, "%v", c.args)
			require.Contains(t, string(out), c.msg, "%v", c.args)
		}
	})
}
