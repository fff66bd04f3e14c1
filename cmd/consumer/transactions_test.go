package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// javaOffsets runs the Java producer example (kafka-clients) over prompts
// with args and returns the partition and the offset of each prompt, as it
// printed them.
func javaOffsets(ctx context.Context, t *testing.T, prompts []envelope.Prompt, args ...string) (int32, []int64) {
	t.Helper()
	var in strings.Builder
	for _, p := range prompts {
		v, err := envelope.Marshal(p)
		require.NoError(t, err)
		in.Write(v)
		in.WriteByte('\n')
	}
	cmd := testkit.JavaProducer(ctx, t, args...)
	cmd.Stdin = strings.NewReader(in.String())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "java Produce %v: %s", args, stderr.String())
	partition := int32(-1)
	var offsets []int64
	for l := range strings.Lines(string(out)) {
		pos, _, ok := strings.Cut(strings.TrimSpace(l), " ")
		require.True(t, ok, "printed %q", l)
		f := strings.Split(pos, "/")
		require.Len(t, f, 3, "topic/partition/offset: %q", pos)
		p, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		require.True(t, partition < 0 || partition == int32(p), "one session, one partition: %s", out)
		partition = int32(p)
		o, err := strconv.ParseInt(f[2], 10, 64)
		require.NoError(t, err)
		offsets = append(offsets, o)
	}
	require.Len(t, offsets, len(prompts), "printed %s", out)
	return partition, offsets
}

// TestTransactionalProducer runs the Java producer example in its
// transactional mode against a running consumer: the prompts of an aborted
// transaction are never admitted, those of a committed one are admitted and
// answered, in order, and a plain prompt between them is not held up. Then
// `consumer replay` rebuilds another database from the topic: over the
// whole partition, which ends on a commit marker, and over a range that
// ends on an abort marker. Both finish (a marker takes an offset that a
// read-committed consumer is never given) and admit only committed prompts.
func TestTransactionalProducer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, "consumer", "")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	txnID := "txn-" + uuid.NewString()

	const sess = "s-txn"
	aborted := []envelope.Prompt{queued(sess, "aborted one"), queued(sess, "aborted two")}
	plain := queued(sess, "plain, between the transactions")
	committed := []envelope.Prompt{queued(sess, "committed one"), queued(sess, "committed two")}

	part, abortedAt := javaOffsets(ctx, t, aborted, "--brokers", b.addr, "--topic", "prompts", "--transactional-id", txnID, "--abort")
	b.send(t, plain)
	part2, committedAt := javaOffsets(ctx, t, committed, "--brokers", b.addr, "--topic", "prompts", "--transactional-id", txnID)
	require.Equal(t, part, part2)

	for _, p := range append([]envelope.Prompt{plain}, committed...) {
		require.Equal(t, "echo: "+p.Text, b.events.waitTurn(t, p.MessageID).Text)
	}
	for _, p := range aborted {
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, p.MessageID), "%q of an aborted transaction is never admitted", p.Text)
		require.Empty(t, b.events.admittedEvents(t, p.MessageID))
	}
	var order []string
	rows, err := b.pool.Query(t.Context(), `SELECT message_id FROM inputs WHERE session_id = $1 ORDER BY admission_seq`, sess)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{plain.MessageID, committed[0].MessageID, committed[1].MessageID}, order, "committed prompts are admitted once, in the partition's order")

	// The log of the partition: two aborted records and the abort marker,
	// the plain prompt, two committed records and the commit marker, which
	// is the last offset.
	abortMarker := abortedAt[len(abortedAt)-1] + 1
	commitMarker := committedAt[len(committedAt)-1] + 1
	end := commitMarker + 1
	require.Less(t, abortMarker, committedAt[0])

	// Replay the whole partition (its high-water mark is after the commit
	// marker) into a fresh database.
	_, fresh := testkit.Pool(t)
	p := strconv.Itoa(int(part))
	rep := b.replayJSON(t, "--database-url", fresh, "--partitions", p)
	require.True(t, rep.Complete, "the range ends on a commit marker: the replay finishes")
	require.Len(t, rep.Partitions, 1)
	require.Equal(t, end, rep.Partitions[0].To)
	require.Equal(t, end, rep.Partitions[0].Next)
	require.Equal(t, int64(3), rep.Totals.Admitted, "the plain and the committed prompts, not the aborted ones")
	require.Equal(t, int64(3), rep.Totals.Messages)

	// A range that ends on the abort marker: nothing in it is delivered.
	_, fresh = testkit.Pool(t)
	rep = b.replayJSON(t, "--database-url", fresh, "--partitions", p,
		"--from-offset", fmt.Sprintf("%s:0", p), "--to-offset", fmt.Sprintf("%s:%d", p, abortMarker+1))
	require.True(t, rep.Complete, "the range ends on an abort marker: the replay finishes")
	require.Equal(t, abortMarker+1, rep.Partitions[0].Next)
	require.Zero(t, rep.Totals.Messages)
	require.Zero(t, rep.Totals.Admitted)
}
