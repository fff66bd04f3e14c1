package replay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/replay"
)

// TestReplayDataErrorRejectsOnlyItsPrompt: a prompt Postgres refuses with
// a data error (SQLSTATE class 23 here, a check constraint) fails on every
// retry; as on the live path (docs/design.md, invariant 13) it is reported
// malformed with reason data_error, and published to the rejects topic
// with --publish-rejects, while the other prompts of its batch are
// admitted (a later exact copy of one of them a duplicate, as the batch
// would have said) and the replay goes on. Before, the data error was
// retried as if transient, then stopped every partition, and a resumed run
// stopped at the same batch.
func TestReplayDataErrorRejectsOnlyItsPrompt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `ALTER TABLE inputs ADD CONSTRAINT test_poison CHECK (text <> 'poison')`)
	require.NoError(t, err)
	one, poison := prompt("s-data", "one"), prompt("s-data", "poison")
	b.send(t, one)
	b.send(t, poison)
	b.send(t, one) // an exact copy, in the same batch most likely
	b.send(t, prompt("s-data", "two"))

	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rep, err := b.replayer(t, b.pool, replay.Config{}).Run(runCtx, "prompts", ranges)
	require.NoError(t, err, "a data error of one prompt stops the whole replay")
	require.True(t, rep.Complete)
	require.Equal(t, int64(2), rep.Totals.Admitted, "the good prompts of the batch are admitted")
	require.Equal(t, int64(1), rep.Totals.Duplicate, "the copy of one is classified against the stored first one")
	require.Equal(t, int64(1), rep.Totals.Malformed, "the refused one is reported")
	require.Equal(t, map[string]int64{envelope.ReasonDataError: 1}, rep.Reasons)
	require.Len(t, rep.Rejections, 1)
	j := rep.Rejections[0]
	require.Equal(t, replay.Malformed.String(), j.Outcome)
	require.Equal(t, envelope.ReasonDataError, j.Reason)
	require.Contains(t, j.Detail, "SQLSTATE 23514")
	require.Equal(t, poison.MessageID, j.MessageID)
	require.Equal(t, 2, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"))
	require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1", poison.MessageID))

	// Again with --publish-rejects: the same classification, and the
	// refused prompt is on the rejects topic as the live consumer puts it.
	rep, err = b.replayer(t, b.pool, replay.Config{PublishRejects: true}).Run(runCtx, "prompts", ranges)
	require.NoError(t, err)
	require.True(t, rep.Complete)
	require.Equal(t, int64(3), rep.Totals.Duplicate)
	require.Equal(t, map[string]int64{envelope.ReasonDataError: 1}, rep.Reasons)
	got := testkit.ReadAll(t, b.addr, "prompts.rejects")
	require.Len(t, got, 1)
	require.Equal(t, envelope.ReasonDataError, testkit.Header(got[0], "reason"))
	require.Contains(t, testkit.Header(got[0], "detail"), "SQLSTATE 23514")
	require.Equal(t, value(t, poison), got[0].Value, "the original bytes")
}

// TestReplayDatabaseErrorStopsTheReplay: a database error that is not a
// data error (here the inputs table is gone: SQLSTATE 42P01) is retried a
// few times, then stops the replay with that error, not as an interrupt;
// the report's next offsets are where the batch began, and once the
// database is back the resumed run admits it (docs/replay.md).
func TestReplayDatabaseErrorStopsTheReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := prompt("s-db-down", "one")
	b.send(t, p)
	_, err := b.pool.Exec(ctx, `ALTER TABLE inputs RENAME TO inputs_away`)
	require.NoError(t, err)

	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rep, err := b.replayer(t, b.pool, replay.Config{}).Run(runCtx, "prompts", ranges)
	require.ErrorContains(t, err, "42P01", "the replay stops with the database's error")
	require.NoError(t, runCtx.Err(), "stopped by the error, not by the test's deadline")
	require.False(t, rep.Complete)
	require.False(t, rep.Interrupted, "an error is not an interrupt")
	require.Zero(t, rep.Totals.Messages, "the batch is not counted")
	for _, part := range rep.Partitions {
		require.Equal(t, part.From, part.Next, "partition %d resumes where it began", part.Partition)
	}

	_, err = b.pool.Exec(ctx, `ALTER TABLE inputs_away RENAME TO inputs`)
	require.NoError(t, err)
	st := rep.Resume()
	rep, err = b.replayer(t, b.pool, replay.Config{}).Run(runCtx, st.Topic, st.Ranges)
	require.NoError(t, err)
	require.True(t, rep.Complete)
	require.Equal(t, int64(1), rep.Totals.Admitted)
	require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1", p.MessageID))
}
