package replay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/replay"
)

// TestReplayStopWaitsForTheRejectsOfAnAdmittedBatch: a stop that comes
// while the rejects of a batch whose admission already committed are being
// published (the rejects topic unavailable: here it does not exist yet)
// waits for them, so that the batch is counted and its partition's next
// offset moves past it; the interrupted run and the resumed one together
// classify every message as one uninterrupted run. Before, the stop ended
// the publish, the batch was not counted although its prompts were
// admitted, and the resumed run reported them duplicate.
func TestReplayStopWaitsForTheRejectsOfAnAdmittedBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One partition: a batch of two (a fresh prompt and a malformed
	// message), then a prompt for the resumed run.
	fresh := prompt("s-int", "fresh")
	b.send(t, fresh)
	malformed := []byte(`{"message_id":`)
	b.sendRaw(t, "prompts", "s-int", malformed, time.Time{})
	b.send(t, prompt("s-int", "later"))
	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)
	cfg := replay.Config{MaxBatch: 2}

	// Uninterrupted, into a database of its own.
	want, err := b.replayer(t, newPool(t), cfg).Run(t.Context(), "prompts", ranges)
	require.NoError(t, err)
	require.Equal(t, int64(2), want.Totals.Admitted)
	require.Equal(t, int64(1), want.Totals.Malformed)

	// Publishing rejects to a topic that does not exist yet is retried.
	const rejectsTopic = "late.rejects"
	logs := testkit.NewSyncBuffer()
	first := cfg
	first.Topics = kafkautil.Topics{Rejects: rejectsTopic}
	first.PublishRejects = true
	first.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		rep *replay.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := b.replayer(t, b.pool, first).Run(ctx, "prompts", ranges)
		done <- result{rep, err}
	}()
	logs.WaitFor(t, "publishing rejects failed; retrying", 60*time.Second)
	require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"), "the batch's admission committed")

	cancel() // SIGINT
	select {
	case r := <-done:
		t.Fatalf("the stop did not wait for the rejects of the admitted batch: %v, %+v", r.err, r.rep.Totals)
	case <-time.After(time.Second):
	}
	logs.WaitFor(t, "a second SIGINT exits at once", 10*time.Second)

	// The rejects topic becomes available: the batch finishes.
	admin, err := sarama.NewClusterAdmin([]string{b.addr}, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic(rejectsTopic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false))
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the interrupted run did not finish once its rejects could be published")
	}
	require.NoError(t, r.err)
	require.True(t, r.rep.Interrupted)
	require.Equal(t, replay.Counts{Messages: 2, Bytes: r.rep.Totals.Bytes, Admitted: 1, Malformed: 1}, r.rep.Totals,
		"the batch is counted")
	for _, p := range r.rep.Partitions {
		if p.Messages > 0 {
			require.Equal(t, p.From+2, p.Next, "the next offset is past the batch")
		}
	}
	rejects := testkit.ReadAll(t, b.addr, rejectsTopic)
	require.Len(t, rejects, 1)
	require.Equal(t, envelope.ReasonInvalidJSON, testkit.Header(rejects[0], "reason"))
	require.Equal(t, malformed, rejects[0].Value)

	st := r.rep.Resume()
	second, err := b.replayer(t, b.pool, cfg).Run(t.Context(), st.Topic, st.Ranges)
	require.NoError(t, err)
	require.True(t, second.Complete)

	union := r.rep.Totals
	union.Messages += second.Totals.Messages
	union.Bytes += second.Totals.Bytes
	union.Admitted += second.Totals.Admitted
	union.Duplicate += second.Totals.Duplicate
	union.Conflict += second.Totals.Conflict
	union.Malformed += second.Totals.Malformed
	require.Equal(t, want.Totals, union, "first run %+v, resumed run %+v", r.rep.Totals, second.Totals)
}

// TestReplayStopGivesUpOnRejectsAfterTheGrace: the wait of a stop for the
// rejects of an admitted batch is bounded by Config.StopGrace. Past it the
// publish is cancelled, the batch is not counted (its partition resumes at
// it) and Run returns the interrupted report; the resumed run reports the
// batch's prompt duplicate and publishes its reject.
func TestReplayStopGivesUpOnRejectsAfterTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send(t, prompt("s-grace", "fresh"))
	malformed := []byte(`{"message_id":`)
	b.sendRaw(t, "prompts", "s-grace", malformed, time.Time{})
	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)

	const rejectsTopic = "late.rejects"
	logs := testkit.NewSyncBuffer()
	cfg := replay.Config{MaxBatch: 2, Topics: kafkautil.Topics{Rejects: rejectsTopic}, PublishRejects: true,
		StopGrace: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type result struct {
		rep *replay.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := b.replayer(t, b.pool, cfg).Run(ctx, "prompts", ranges)
		done <- result{rep, err}
	}()
	logs.WaitFor(t, "publishing rejects failed; retrying", 60*time.Second)
	require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"), "the batch's admission committed")

	cancel() // SIGINT
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the stop still waited for the rejects 30s after it, with a grace of 500ms")
	}
	require.NoError(t, r.err)
	require.True(t, r.rep.Interrupted)
	require.Zero(t, r.rep.Totals.Messages, "the batch is not counted")
	for _, p := range r.rep.Partitions {
		require.Equal(t, p.From, p.Next, "partition %d resumes at the batch", p.Partition)
	}
	require.Contains(t, logs.String(), "the stop's grace")

	admin, err := sarama.NewClusterAdmin([]string{b.addr}, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic(rejectsTopic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false))
	resumed := cfg
	resumed.Logger = nil
	st := r.rep.Resume()
	second, err := b.replayer(t, b.pool, resumed).Run(t.Context(), st.Topic, st.Ranges)
	require.NoError(t, err)
	require.True(t, second.Complete)
	require.Equal(t, replay.Counts{Messages: 2, Bytes: second.Totals.Bytes, Duplicate: 1, Malformed: 1}, second.Totals)
	rejects := testkit.ReadAll(t, b.addr, rejectsTopic)
	require.NotEmpty(t, rejects, "the resumed run publishes the batch's reject")
	for _, m := range rejects {
		require.Equal(t, malformed, m.Value)
	}
}
