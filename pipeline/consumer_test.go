package pipeline_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// TestRejectTooLargeToPublishWhole: a reject is larger than its original
// (the headers), so an original close to the producer's limit, or above a
// rejects topic's max.message.bytes, makes a reject no retry can publish.
// It is published truncated, with the original's size and SHA-256, and the
// partition moves on (issue 15, item 1).
func TestRejectTooLargeToPublishWhole(t *testing.T) {
	t.Parallel()

	check := func(t *testing.T, b *testBundle, original []byte, limit int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(b.rejects.All()) == 1 }, 20*time.Second, 10*time.Millisecond)
		r := b.rejects.All()[0]
		require.Equal(t, envelope.ReasonInvalidJSON, testkit.Header(r, "reason"))
		require.Equal(t, strconv.Itoa(len(original)), testkit.Header(r, "original_value_bytes"))
		sum := sha256.Sum256(original)
		require.Equal(t, hex.EncodeToString(sum[:]), testkit.Header(r, "original_value_sha256"))
		require.NotEmpty(t, r.Value, "as much of the original as fits")
		require.Less(t, len(r.Value), len(original))
		require.True(t, bytes.HasPrefix(original, r.Value), "a prefix of the original")
		require.NotEmpty(t, testkit.Header(r, "source_offset"), "the source is named")
		pm := &sarama.ProducerMessage{Key: sarama.ByteEncoder(r.Key), Value: sarama.ByteEncoder(r.Value)}
		for _, h := range r.Headers {
			pm.Headers = append(pm.Headers, *h)
		}
		require.LessOrEqual(t, pm.ByteSize(2), limit)
	}

	t.Run("ProducerLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess := id(t, "s")
		// Invalid JSON the broker and the producer accept (1 MiB limits),
		// below --max-value-bytes: its reject is not.
		value := bytes.Repeat([]byte("x"), 1_048_400)
		b.sendRaw(t, []byte(sess), value)
		b.send(t, envelope.Prompt{MessageID: id(t, "after"), SessionID: sess, Text: "behind it"})
		require.Equal(t, "echo: behind it", b.waitTurn(t, id(t, "after")).Text, "the partition moved on")
		check(t, b, value, kafkautil.MaxMessageBytesDefault)
	})

	t.Run("BrokerLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		// The rejects topic takes less than the producer sends: the broker
		// refuses the reject, which is then cut further.
		const topicLimit = 20_000
		admin, err := sarama.NewClusterAdmin(b.brokers, kafkautil.NewConfig(t.Name()+"-admin"))
		require.NoError(t, err)
		defer admin.Close()
		limit := strconv.Itoa(topicLimit)
		require.NoError(t, admin.AlterConfig(sarama.TopicResource, "prompts.rejects", map[string]*string{"max.message.bytes": &limit}, false))

		sess := id(t, "s")
		value := []byte(`{"message_id":"m","session_id":"` + sess + `","text":"` + strings.Repeat("y", 100_000))
		b.sendRaw(t, []byte(sess), value)
		b.send(t, envelope.Prompt{MessageID: id(t, "after"), SessionID: sess, Text: "behind it"})
		require.Equal(t, "echo: behind it", b.waitTurn(t, id(t, "after")).Text, "the partition moved on")
		check(t, b, value, topicLimit)
	})
}

// TestRejectOfHugeHeadersIsPublishedCut: a prompt whose headers are about
// 1 MB is rejected as headers_too_large, and its reject, larger than the
// producer sends, was cut of its value and key but never of the original's
// headers: it stayed too large and was dropped (reject_unpublished). The
// original's headers are cut too, with their size and SHA-256, so the
// reject is published and says it is not the whole original.
func TestRejectOfHugeHeadersIsPublishedCut(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	sess := id(t, "s")
	v, err := envelope.Marshal(envelope.Prompt{MessageID: id(t, "huge"), SessionID: sess, Text: "headers"})
	require.NoError(t, err)
	headers := []sarama.RecordHeader{
		{Key: []byte("trace"), Value: []byte("t1")},
		{Key: []byte("empty"), Value: []byte{}},
		{Key: []byte("big"), Value: bytes.Repeat([]byte("h"), 500_000)},
		{Key: []byte("bigger")},
	}
	pm := &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(sess), Value: sarama.ByteEncoder(v), Headers: headers}
	// The prompt just fits the producer's limit: its reject, with
	// promptline's headers added, does not.
	headers[3].Value = bytes.Repeat([]byte("H"), kafkautil.MaxMessageBytesDefault-50-pm.ByteSize(2))
	require.Equal(t, kafkautil.MaxMessageBytesDefault-50, pm.ByteSize(2))
	_, _, err = b.producer.SendMessage(pm)
	require.NoError(t, err)
	b.send(t, envelope.Prompt{MessageID: id(t, "after"), SessionID: sess, Text: "behind it"})
	require.Equal(t, "echo: behind it", b.waitTurn(t, id(t, "after")).Text, "the partition moved on")

	require.Eventually(t, func() bool { return len(b.rejects.All()) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the reject was published")
	r := b.rejects.All()[0]
	require.Equal(t, envelope.ReasonHeadersTooLarge, testkit.Header(r, "reason"))
	// The documented encoding: each header as a Kafka record (v2) holds
	// it, the key's length and the value's as zigzag varints, -1 for a
	// null value.
	var enc []byte
	for _, h := range headers {
		enc = binary.AppendVarint(enc, int64(len(h.Key)))
		enc = append(enc, h.Key...)
		if h.Value == nil {
			enc = binary.AppendVarint(enc, -1)
			continue
		}
		enc = binary.AppendVarint(enc, int64(len(h.Value)))
		enc = append(enc, h.Value...)
	}
	sum := sha256.Sum256(enc)
	require.Equal(t, strconv.Itoa(len(enc)), testkit.Header(r, "original_headers_bytes"))
	require.Equal(t, hex.EncodeToString(sum[:]), testkit.Header(r, "original_headers_sha256"))
	require.Empty(t, kafkautil.OriginalHeaders(r.Headers), "none of the original's headers is kept")
	require.True(t, kafkautil.Truncated(r.Headers), "never re-admitted from the rejects topic as if whole")
	require.Equal(t, sess, string(r.Key), "the key fits once the headers are gone")
	require.Equal(t, v, r.Value, "so does the value")
	rm := &sarama.ProducerMessage{Key: sarama.ByteEncoder(r.Key), Value: sarama.ByteEncoder(r.Value)}
	for _, h := range r.Headers {
		rm.Headers = append(rm.Headers, *h)
	}
	require.LessOrEqual(t, rm.ByteSize(2), kafkautil.MaxMessageBytesDefault)
}

// TestRejectsRefusedTogetherAreSentAlone: the broker checks its limit on
// a whole record batch, so rejects that each fit may be refused together;
// each is then sent alone, whole, before anything is truncated.
//
// The path needs the three rejects in one publish, which needs the three
// originals in one batch of the consumer, and Sarama delivers what it
// fetched when it fetched it: a round whose messages came apart passes
// without reaching the path. The publisher's log says when it split a
// publish refused together (and how many), so each round proves whether it
// got there; rounds go on until one has, at most maxBatchRounds.
func TestRejectsRefusedTogetherAreSentAlone(t *testing.T) {
	t.Parallel()
	logs := testkit.NewSyncBuffer()
	b := setup(t, setupOpts{logs: logs})
	const topicLimit = 20_000
	admin, err := sarama.NewClusterAdmin(b.brokers, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	limit := strconv.Itoa(topicLimit)
	require.NoError(t, admin.AlterConfig(sarama.TopicResource, "prompts.rejects", map[string]*string{"max.message.bytes": &limit}, false))

	const split = `msg="rejects refused together; sending each alone" rejects=3`
	for round := 1; ; round++ {
		sess := id(t, fmt.Sprintf("s%d", round))
		before := strings.Count(logs.String(), split)
		var originals [][]byte
		var msgs []*sarama.ProducerMessage
		for i := range 3 {
			v := []byte(fmt.Sprintf(`{"message_id":"m%d","session_id":"%s","text":"%s`, i, sess, strings.Repeat("z", 8_000)))
			originals = append(originals, v)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(sess), Value: sarama.ByteEncoder(v)})
		}
		require.NoError(t, b.producer.SendMessages(msgs))
		b.send(t, envelope.Prompt{MessageID: id(t, fmt.Sprintf("after%d", round)), SessionID: sess, Text: "behind them"})
		b.waitTurn(t, id(t, fmt.Sprintf("after%d", round)))
		var mine []*sarama.ConsumerMessage
		require.Eventually(t, func() bool {
			mine = mine[:0]
			for _, r := range b.rejects.All() {
				if string(r.Key) == sess {
					mine = append(mine, r)
				}
			}
			return len(mine) == len(originals)
		}, 20*time.Second, 10*time.Millisecond)
		for _, r := range mine {
			require.Empty(t, testkit.Header(r, "original_value_bytes"), "a reject that fits alone is not truncated")
			require.Contains(t, originals, r.Value)
		}
		reached := strings.Count(logs.String(), split) > before
		t.Logf("round %d: the three rejects refused together and sent alone: %v", round, reached)
		if reached {
			return
		}
		require.Less(t, round, maxBatchRounds, "no round delivered its three messages as one batch: the path was never reached")
	}
}

// maxBatchRounds bounds the rounds of a test that needs Sarama to deliver
// its messages as one batch.
const maxBatchRounds = 5

// TestRejectPublishRetriedWhileTopicUnavailable: a transient failure to
// publish a reject (here: the rejects topic does not exist yet) is retried
// and never drops or truncates the reject; the partition waits meanwhile,
// and goes on once the reject is out.
func TestRejectPublishRetriedWhileTopicUnavailable(t *testing.T) {
	t.Parallel()
	logs := testkit.NewSyncBuffer()
	b := setup(t, setupOpts{rejectsTopic: "late.rejects", logs: logs})
	sess := id(t, "s")
	bad := []byte(`{"message_id":"m","session_id":"` + sess + `"`)
	b.sendRaw(t, []byte(sess), bad)
	const retrying = "publishing rejects failed; retrying"
	n := waitCount(t, logs, retrying, 1)

	// A prompt behind it waits: its partition's offset has not moved.
	b.send(t, envelope.Prompt{MessageID: id(t, "after"), SessionID: sess, Text: "behind it"})
	waitCount(t, logs, retrying, n+1)
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, id(t, "after")),
		"the prompt behind an unpublished reject is not admitted")

	admin, err := sarama.NewClusterAdmin(b.brokers, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic("late.rejects", &sarama.TopicDetail{NumPartitions: testPartitions, ReplicationFactor: 1}, false))
	rejects := testkit.ReadTopic(t, b.brokers, "late.rejects", nil)

	require.Equal(t, "echo: behind it", b.waitTurn(t, id(t, "after")).Text, "the partition moved on")
	require.Eventually(t, func() bool { return len(rejects.All()) == 1 }, 20*time.Second, 10*time.Millisecond)
	r := rejects.All()[0]
	require.Equal(t, envelope.ReasonInvalidJSON, testkit.Header(r, "reason"))
	require.Equal(t, bad, r.Value, "whole: a transient error truncates nothing")
	require.Empty(t, testkit.Header(r, "original_value_bytes"))
}

// TestAdmissionRetriedAfterTransientFailure: an admission transaction that
// fails for a reason a retry fixes (its backend terminated, as a failover
// or a pooler restart does) is retried until it commits; the prompt is
// admitted once, and its offset is committed only after.
func TestAdmissionRetriedAfterTransientFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := testkit.NewSyncBuffer()
	b := setup(t, setupOpts{logs: logs})
	sess := id(t, "s")
	part := kafkautil.Murmur2Partition([]byte(sess), testPartitions)
	probe := ""
	for i := 0; probe == ""; i++ {
		if s := id(t, fmt.Sprintf("probe%d", i)); kafkautil.Murmur2Partition([]byte(s), testPartitions) != part {
			probe = s
		}
	}

	// Hold the session's row: admission upserts it, so it waits for us.
	_, err := b.pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1)`, sess)
	require.NoError(t, err)
	locker, err := pgx.Connect(ctx, b.dbURL)
	require.NoError(t, err)
	defer locker.Close(ctx)
	lock, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, sess)
	require.NoError(t, err)
	blocked := func(not int32) int32 {
		var pid int32
		require.Eventually(t, func() bool {
			err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) AND pid <> $2`,
				locker.PgConn().PID(), not).Scan(&pid)
			return err == nil
		}, 20*time.Second, 10*time.Millisecond, "no admission waits for the session row")
		return pid
	}

	msgID := id(t, "m")
	v, err := envelope.Marshal(envelope.Prompt{MessageID: msgID, SessionID: sess, Text: "retried"})
	require.NoError(t, err)
	_, offset, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(sess), Value: sarama.ByteEncoder(v)})
	require.NoError(t, err)

	// Three failures: each retry, on another connection, waits again.
	var last int32
	for i := 1; i <= 3; i++ {
		pid := blocked(last)
		var terminated bool
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&terminated))
		require.True(t, terminated)
		waitCount(t, logs, "admission failed; retrying", i)
		last = pid
	}
	blocked(last)
	// The backoff starts at 100 ms and doubles, each wait drawn within
	// half of it either way (retry.Do).
	var waits []time.Duration
	for _, m := range regexp.MustCompile(`admission failed; retrying.* backoff=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
		d, err := time.ParseDuration(m[1])
		require.NoError(t, err)
		waits = append(waits, d)
	}
	require.Len(t, waits, 3)
	for i, backoff := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		require.GreaterOrEqual(t, waits[i], backoff/2, "wait %d of %v", i, waits)
		require.LessOrEqual(t, waits[i], backoff*3/2, "wait %d of %v", i, waits)
	}

	// Another partition's prompt is admitted and its offset committed; the
	// consumer commits every partition's marked offset together, so ours
	// would be committed by now had it been marked.
	admin, err := sarama.NewClusterAdmin(b.brokers, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	committed := func(p int32) int64 {
		resp, err := admin.ListConsumerGroupOffsets("test", map[string][]int32{"prompts": {p}})
		require.NoError(t, err)
		blk := resp.GetBlock("prompts", p)
		require.NotNil(t, blk)
		return blk.Offset
	}
	pv, err := envelope.Marshal(envelope.Prompt{MessageID: id(t, "probe"), SessionID: probe, Text: "probe"})
	require.NoError(t, err)
	probePart, probeOffset, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(probe), Value: sarama.ByteEncoder(pv)})
	require.NoError(t, err)
	b.waitTurn(t, id(t, "probe"))
	require.Eventually(t, func() bool { return committed(probePart) > probeOffset }, 20*time.Second, 20*time.Millisecond)
	require.LessOrEqual(t, committed(part), offset, "the offset of a prompt not yet admitted was committed")
	require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msgID))

	require.NoError(t, lock.Rollback(ctx))
	require.Equal(t, "echo: retried", b.waitTurn(t, msgID).Text)
	require.Eventually(t, func() bool { return committed(part) == offset+1 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msgID))
	require.Equal(t, 1, b.turnsFor(t, msgID), "admitted and run once")
}

// TestDataErrorRejectsOnlyItsPrompt: a prompt Postgres refuses with a data
// error (SQLSTATE class 23 here, a check constraint) fails on every retry;
// it becomes a reject, the good prompts of its batch are admitted, and the
// partition moves on (issue 15, item 4).
//
// The batch path (the batch refused, then admitted one prompt at a time)
// needs the three prompts in one batch of the consumer, which Sarama does
// not promise; the consumer logs how many prompts it admits one by one, so
// each round proves whether it got there, and rounds go on until one has,
// at most maxBatchRounds.
func TestDataErrorRejectsOnlyItsPrompt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := testkit.NewSyncBuffer()
	b := setup(t, setupOpts{logs: logs})
	_, err := b.pool.Exec(ctx, `ALTER TABLE inputs ADD CONSTRAINT test_poison CHECK (text <> 'poison')`)
	require.NoError(t, err)

	const oneByOne = `admitting the batch's prompts one by one" prompts=3`
	for round := 1; ; round++ {
		sess := id(t, fmt.Sprintf("s%d", round))
		good1, bad, good2 := id(t, fmt.Sprintf("good1-%d", round)), id(t, fmt.Sprintf("bad%d", round)), id(t, fmt.Sprintf("good2-%d", round))
		before := strings.Count(logs.String(), oneByOne)
		var msgs []*sarama.ProducerMessage
		for _, p := range []envelope.Prompt{
			{MessageID: good1, SessionID: sess, Text: "one"},
			{MessageID: bad, SessionID: sess, Text: "poison"},
			{MessageID: good2, SessionID: sess, Text: "two"},
		} {
			v, err := envelope.Marshal(p)
			require.NoError(t, err)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(sess), Value: sarama.ByteEncoder(v)})
		}
		require.NoError(t, b.producer.SendMessages(msgs))
		require.Equal(t, "echo: one", b.waitTurn(t, good1).Text)
		require.Equal(t, "echo: two", b.waitTurn(t, good2).Text)
		var mine []*sarama.ConsumerMessage
		require.Eventually(t, func() bool {
			mine = mine[:0]
			for _, r := range b.rejects.All() {
				if string(r.Key) == sess {
					mine = append(mine, r)
				}
			}
			return len(mine) == 1
		}, 20*time.Second, 10*time.Millisecond)
		r := mine[0]
		require.Equal(t, envelope.ReasonDataError, testkit.Header(r, "reason"))
		require.Contains(t, testkit.Header(r, "detail"), "23514")
		require.Contains(t, string(r.Value), bad)
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, bad))

		after := id(t, fmt.Sprintf("after%d", round))
		b.send(t, envelope.Prompt{MessageID: after, SessionID: sess, Text: "after"})
		b.waitTurn(t, after)

		reached := strings.Count(logs.String(), oneByOne) > before
		t.Logf("round %d: the batch of three admitted one by one: %v", round, reached)
		if reached {
			return
		}
		require.Less(t, round, maxBatchRounds, "no round delivered its three prompts as one batch: the path was never reached")
	}
}

// TestPermissionRepliesOnePartition: hostile permission replies on one
// partition each become a reject, with the prompts' reasons, and change
// no request; a valid reply behind them is applied (issue 15, items 4 and
// 14). Before: the NUL reply stopped the partition (SQLSTATE 22021 on
// every retry), and wrongly-cased or repeated names approved.
func TestPermissionRepliesOnePartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{replies: true})
	sess := id(t, "s")

	// Pending requests without the turn that would have asked them: the
	// tool call they point to is not under test, so its foreign key goes.
	_, err := b.pool.Exec(ctx, `ALTER TABLE permission_requests DROP CONSTRAINT permission_requests_call_id_fkey`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1)`, sess)
	require.NoError(t, err)
	requests := []string{"r-nul", "r-case", "r-repeat", "r-upper", "r-headers", "r-poison", "r-last"}
	for _, r := range requests {
		_, err = b.pool.Exec(ctx, `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, status)
			VALUES ($1, $2, $1, 'echo', 'echo', 'pending')`, r, sess)
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(ctx, `ALTER TABLE permission_requests ADD CONSTRAINT test_poison CHECK (message IS DISTINCT FROM 'poison')`)
	require.NoError(t, err)

	cases := []struct {
		value   string
		headers []sarama.RecordHeader
		reason  string
	}{
		{`{"request_id":"r-nul","reply":"reject","message":"a\u0000b"}`, nil, envelope.ReasonInvalidField},
		{`{"request_id":"r-case","reply":"reject","Reply":"once"}`, nil, envelope.ReasonUnknownField},
		{`{"request_id":"r-repeat","reply":"reject","reply":"once"}`, nil, envelope.ReasonInvalidJSON},
		{`{"Request_ID":"r-upper","REPLY":"once"}`, nil, envelope.ReasonUnknownField},
		{`{"request_id":"r-headers","reply":"once"}`, manyHeaders(40, 1), envelope.ReasonTooManyHeaders},
		{`{"request_id":"r-poison","reply":"reject","message":"poison"}`, nil, envelope.ReasonDataError},
	}
	for _, c := range cases {
		_, _, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "permission-replies", Key: sarama.StringEncoder(sess),
			Value: sarama.StringEncoder(c.value), Headers: c.headers})
		require.NoError(t, err)
	}
	_, _, err = b.producer.SendMessage(&sarama.ProducerMessage{Topic: "permission-replies", Key: sarama.StringEncoder(sess),
		Value: sarama.StringEncoder(`{"request_id":"r-last","reply":"once"}`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM permission_requests WHERE request_id = 'r-last' AND status = 'approved'`) == 1
	}, 20*time.Second, 10*time.Millisecond, "the reply behind them was applied")
	require.Eventually(t, func() bool { return len(b.rejects.All()) == len(cases) }, 20*time.Second, 10*time.Millisecond)
	for i, r := range b.rejects.All() {
		require.Equal(t, cases[i].reason, testkit.Header(r, "reason"), "%s: %s", cases[i].value, testkit.Header(r, "detail"))
		require.Equal(t, cases[i].value, string(r.Value))
	}
	require.Equal(t, len(requests)-1, b.count(t, `SELECT count(*) FROM permission_requests WHERE status = 'pending'`),
		"no hostile reply changed its request")
}

// waitCount waits until s occurs at least n times in buf and returns how
// many times it does.
func waitCount(t *testing.T, buf *testkit.SyncBuffer, s string, n int) int {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		if c := strings.Count(buf.String(), s); c >= n {
			return c
		}
		select {
		case <-buf.Changed():
		case <-deadline.C:
			t.Fatalf("waiting for %d times %q", n, s)
		}
	}
}
