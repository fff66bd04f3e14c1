package replay_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/replay"
)

const partitions = 4

type testBundle struct {
	addr     string
	pool     *pgxpool.Pool
	client   sarama.Client
	producer sarama.SyncProducer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	addr := testkit.Broker(t, partitions).Addr()
	pool, _ := testkit.Pool(t)
	cfg := kafkautil.NewConfig("replay-test")
	client, err := sarama.NewClient([]string{addr}, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	producer, err := sarama.NewSyncProducerFromClient(client)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, producer.Close()) })
	return &testBundle{addr: addr, pool: pool, client: client, producer: producer}
}

// newPool is another fresh database, for comparing two replays.
func newPool(t *testing.T) *pgxpool.Pool {
	pool, _ := testkit.Pool(t)
	return pool
}

func prompt(session, text string) envelope.Prompt {
	return envelope.Prompt{MessageID: "m-" + uuid.NewString(), SessionID: session, Text: text, Delivery: envelope.DeliveryQueue}
}

func value(t *testing.T, p envelope.Prompt) []byte {
	t.Helper()
	v, err := envelope.Marshal(p)
	require.NoError(t, err)
	return v
}

// send publishes raw records (key = session) and returns their offsets.
func (b *testBundle) sendRaw(t *testing.T, topic, key string, v []byte, at time.Time, headers ...sarama.RecordHeader) (int32, int64) {
	t.Helper()
	m := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(v), Timestamp: at, Headers: headers}
	p, o, err := b.producer.SendMessage(m)
	require.NoError(t, err)
	return p, o
}

func (b *testBundle) send(t *testing.T, p envelope.Prompt) {
	t.Helper()
	b.sendRaw(t, "prompts", p.SessionID, value(t, p), time.Time{})
}

func (b *testBundle) replayer(t *testing.T, pool *pgxpool.Pool, cfg replay.Config) *replay.Replayer {
	t.Helper()
	r, err := replay.New(pool, b.client, b.producer, &cfg)
	require.NoError(t, err)
	return r
}

// run replays the whole topic (as resolved now).
func (b *testBundle) run(t *testing.T, pool *pgxpool.Pool, topic string, cfg replay.Config, bounds replay.Bounds) *replay.Report {
	t.Helper()
	ranges, err := replay.Resolve(b.client, topic, bounds)
	require.NoError(t, err)
	rep, err := b.replayer(t, pool, cfg).Run(t.Context(), topic, ranges)
	require.NoError(t, err)
	return rep
}

// inputs lists the admitted inputs: what a replay rebuilds.
func inputs(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id || '|' || session_id || '|' || text || '|' || delivery || '|' ||
		encode(payload_hash, 'hex') || '|' || source_topic || '/' || source_partition || '/' || source_offset FROM inputs ORDER BY message_id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func rowCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"inputs", "sessions", "outbox", "messages"} {
		out[table] = testkit.Count(t, pool, "SELECT count(*) FROM "+table)
	}
	return out
}

// mixed publishes fresh, duplicate, conflicting and malformed messages:
// dup and conflict are admitted beforehand through the Admitter.
type mixed struct {
	fresh, dup []envelope.Prompt
	conflict   envelope.Prompt // as published: another text than admitted
	malformed  int
}

func (b *testBundle) publishMixed(t *testing.T, pool *pgxpool.Pool) mixed {
	t.Helper()
	var m mixed
	for i := range 6 {
		m.fresh = append(m.fresh, prompt(fmt.Sprintf("s-fresh-%d", i%3), fmt.Sprintf("fresh %d", i)))
	}
	for i := range 3 {
		m.dup = append(m.dup, prompt(fmt.Sprintf("s-dup-%d", i), fmt.Sprintf("dup %d", i)))
	}
	original := prompt("s-conflict", "the original")
	m.conflict = original
	m.conflict.Text = "another text under the same message_id"
	var pre []admission.Incoming
	for _, p := range append(m.dup, original) {
		pre = append(pre, admission.Incoming{Prompt: p, Source: admission.Source{Topic: "elsewhere"}})
	}
	_, err := admission.NewAdmitter(pool, &admission.AdmitterConfig{}).Admit(t.Context(), pre)
	require.NoError(t, err)

	for _, p := range m.fresh {
		b.send(t, p)
	}
	for _, p := range m.dup {
		b.send(t, p)
	}
	b.send(t, m.conflict)
	b.send(t, m.fresh[0]) // an exact retry inside the range
	b.sendRaw(t, "prompts", "s-bad", []byte(`{"message_id":`), time.Time{})
	b.sendRaw(t, "prompts", "s-other", value(t, prompt("s-bad", "key mismatch")), time.Time{})
	m.malformed = 2
	return m
}

func TestReplay(t *testing.T) {
	t.Parallel()

	t.Run("MixedRange", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		m := b.publishMixed(t, b.pool)
		before := testkit.Count(t, b.pool, "SELECT count(*) FROM inputs")

		rep := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{})
		require.True(t, rep.Complete)
		require.False(t, rep.Interrupted)
		total := len(m.fresh) + len(m.dup) + 1 + 1 + m.malformed
		require.Equal(t, replay.Counts{
			Messages: int64(total), Bytes: rep.Totals.Bytes,
			Admitted: int64(len(m.fresh)), Duplicate: int64(len(m.dup) + 1), Conflict: 1, Malformed: int64(m.malformed),
		}, rep.Totals)
		require.Positive(t, rep.Totals.Bytes)
		require.Equal(t, map[string]int64{"conflict": 1, "invalid_json": 1, "key_mismatch": 1}, rep.Reasons)
		require.Len(t, rep.Rejections, 3)
		for _, j := range rep.Rejections {
			if j.Outcome == "conflict" {
				require.Equal(t, m.conflict.MessageID, j.MessageID)
			}
		}
		var perPartition int64
		for _, p := range rep.Partitions {
			perPartition += p.Messages
			require.True(t, p.Done())
			if p.Messages > 0 {
				require.Equal(t, p.From, p.First)
				require.Equal(t, p.To-1, p.Last)
			}
		}
		require.Equal(t, int64(total), perPartition)

		// The rows: one input per fresh prompt, no wake armed, the
		// conflicting one unchanged.
		require.Equal(t, before+len(m.fresh), testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"))
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE source_topic = 'prompts' AND wake_pending"))
		require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1 AND text = 'the original'", m.conflict.MessageID))
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key LIKE 's-fresh-%'"))
		require.Equal(t, len(m.fresh), testkit.Count(t, b.pool, "SELECT count(*) FROM outbox WHERE topic = 'session-events' AND key LIKE 's-fresh-%'"))

		// A second identical replay admits nothing.
		rows := rowCounts(t, b.pool)
		again := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{})
		require.Zero(t, again.Totals.Admitted)
		require.Equal(t, int64(len(m.fresh)+len(m.dup)+1), again.Totals.Duplicate)
		require.Equal(t, int64(1), again.Totals.Conflict)
		require.Equal(t, int64(m.malformed), again.Totals.Malformed)
		require.Equal(t, rows, rowCounts(t, b.pool))
	})

	t.Run("FreshDatabaseRebuildsInputs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 40 {
			b.send(t, prompt(fmt.Sprintf("s-%d", i%7), fmt.Sprintf("prompt %d", i)))
		}
		first := newPool(t)
		b.run(t, first, "prompts", replay.Config{}, replay.Bounds{})
		second := newPool(t)
		rep := b.run(t, second, "prompts", replay.Config{MaxBatch: 3}, replay.Bounds{})
		require.Equal(t, int64(40), rep.Totals.Admitted)
		require.Len(t, inputs(t, first), 40)
		require.Equal(t, inputs(t, first), inputs(t, second), "the inputs are a function of the topic")
		require.Equal(t, 7, testkit.Count(t, second, "SELECT count(*) FROM sessions"))
	})

	t.Run("DryRunWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		m := b.publishMixed(t, b.pool)
		rows := rowCounts(t, b.pool)
		dry := b.run(t, b.pool, "prompts", replay.Config{DryRun: true}, replay.Bounds{})
		require.True(t, dry.DryRun)
		require.Equal(t, rows, rowCounts(t, b.pool), "a dry run writes nothing")
		require.Equal(t, int64(len(m.fresh)), dry.Totals.Admitted)

		// It classifies as the real run does.
		real := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{})
		dry.Totals.Bytes, real.Totals.Bytes = 0, 0
		require.Equal(t, real.Totals, dry.Totals)
		require.Equal(t, real.Reasons, dry.Reasons)
	})

	t.Run("TimeRange", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		inside := map[string]bool{}
		for i := range 30 {
			p := prompt(fmt.Sprintf("s-%d", i%5), fmt.Sprintf("minute %d", i))
			at := base.Add(time.Duration(i) * time.Minute)
			b.sendRaw(t, "prompts", p.SessionID, value(t, p), at)
			if i >= 10 && i < 20 {
				inside[p.MessageID] = true
			}
		}
		rep := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{
			FromTime: base.Add(10 * time.Minute), ToTime: base.Add(20 * time.Minute),
		})
		require.Equal(t, int64(10), rep.Totals.Admitted)
		require.Equal(t, int64(10), rep.Totals.Messages)
		got := map[string]bool{}
		for _, row := range inputs(t, b.pool) {
			got[strings.SplitN(row, "|", 2)[0]] = true
		}
		require.Equal(t, inside, got)
	})

	t.Run("InterruptAndResume", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 200 {
			b.send(t, prompt(fmt.Sprintf("s-%d", i%11), fmt.Sprintf("prompt %d", i)))
		}
		b.send(t, envelope.Prompt{MessageID: "m-bad", SessionID: "s-1", Text: ""}) // malformed
		ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
		require.NoError(t, err)

		// Uninterrupted, into its own database.
		whole := newPool(t)
		want, err := b.replayer(t, whole, replay.Config{MaxBatch: 10}).Run(t.Context(), "prompts", ranges)
		require.NoError(t, err)

		// Interrupted after 60 messages, then resumed from the report.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var seen atomic.Int64
		first, err := b.replayer(t, b.pool, replay.Config{MaxBatch: 10, OnBatchFunc: func(int32, int64) {
			if seen.Add(1) == 6 {
				cancel()
			}
		}}).Run(ctx, "prompts", ranges)
		require.NoError(t, err)
		require.True(t, first.Interrupted)
		require.Less(t, first.Totals.Messages, want.Totals.Messages)
		st := first.Resume()
		second, err := b.replayer(t, b.pool, replay.Config{MaxBatch: 10}).Run(t.Context(), st.Topic, st.Ranges)
		require.NoError(t, err)
		require.True(t, second.Complete)

		var union replay.Counts
		for _, r := range []*replay.Report{first, second} {
			union.Messages += r.Totals.Messages
			union.Bytes += r.Totals.Bytes
			union.Admitted += r.Totals.Admitted
			union.Duplicate += r.Totals.Duplicate
			union.Conflict += r.Totals.Conflict
			union.Malformed += r.Totals.Malformed
		}
		require.Equal(t, want.Totals, union)
		require.Equal(t, inputs(t, whole), inputs(t, b.pool))
	})

	t.Run("WakeOnlyWithWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ps := []envelope.Prompt{prompt("s-w1", "one"), prompt("s-w2", "two")}
		for _, p := range ps {
			b.send(t, p)
		}
		rep := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{})
		require.Equal(t, int64(2), rep.Totals.Admitted)
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE wake_pending"))
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM outbox WHERE topic = 'wakes'"))

		// An exact retry with resume true (a replay with --wake) arms them.
		again := b.run(t, b.pool, "prompts", replay.Config{Wake: true}, replay.Bounds{})
		require.Equal(t, int64(2), again.Totals.Duplicate)
		require.Equal(t, 2, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE wake_pending"))
		require.Equal(t, 2, testkit.Count(t, b.pool, "SELECT count(*) FROM outbox WHERE topic = 'wakes'"))

		// Once armed, a further wake replay changes nothing.
		rows := rowCounts(t, b.pool)
		b.run(t, b.pool, "prompts", replay.Config{Wake: true}, replay.Bounds{})
		require.Equal(t, rows, rowCounts(t, b.pool))
	})

	// A prompt whose ID an input of another kind holds is a conflict, as
	// live admission says (invariant 2), even with the same payload hash:
	// replay classifies by admission's rule, not by a copy of it.
	t.Run("IDHeldByAnotherKindIsAConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := prompt("s-k", "hello")
		b.send(t, p)
		_, err := b.pool.Exec(t.Context(), `INSERT INTO sessions (session_id) VALUES ($1)`, p.SessionID)
		require.NoError(t, err)
		_, err = b.pool.Exec(t.Context(), `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, $2, '', $3, 'steer', false, 'continuation')`, p.MessageID, p.SessionID, p.Hash())
		require.NoError(t, err)
		for _, cfg := range []replay.Config{{}, {Wake: true}, {DryRun: true}} {
			rep := b.run(t, b.pool, "prompts", cfg, replay.Bounds{})
			require.Equal(t, int64(1), rep.Totals.Conflict, "%+v", cfg)
			require.Zero(t, rep.Totals.Duplicate, "%+v", cfg)
		}
		got, err := admission.NewAdmitter(b.pool, &admission.AdmitterConfig{}).Admit(t.Context(), []admission.Incoming{{Prompt: p}})
		require.NoError(t, err)
		require.Equal(t, []admission.Outcome{admission.Conflict}, got, "live admission agrees")
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE kind = 'prompt'"))
	})

	t.Run("RejectsReplay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hdr := func(reason string, part int32, off int64) []sarama.RecordHeader {
			return []sarama.RecordHeader{
				{Key: []byte("reason"), Value: []byte(reason)},
				{Key: []byte("detail"), Value: []byte("test")},
				{Key: []byte("source_topic"), Value: []byte("prompts")},
				{Key: []byte("source_partition"), Value: []byte(fmt.Sprint(part))},
				{Key: []byte("source_offset"), Value: []byte(fmt.Sprint(off))},
			}
		}
		big := prompt("s-big", strings.Repeat("x", 3000))
		b.sendRaw(t, "prompts.rejects", big.SessionID, value(t, big), time.Time{}, hdr("too_large", 2, 40)...)
		b.sendRaw(t, "prompts.rejects", "s-bad", []byte(`not json`), time.Time{}, hdr("invalid_json", 1, 7)...)
		reply := []sarama.RecordHeader{{Key: []byte("reason"), Value: []byte("unknown_request")}, {Key: []byte("source_topic"), Value: []byte("permission-replies")},
			{Key: []byte("source_partition"), Value: []byte("0")}, {Key: []byte("source_offset"), Value: []byte("3")}}
		b.sendRaw(t, "prompts.rejects", "s-r", []byte(`{"request_id":"x"}`), time.Time{}, reply...)

		// With the old limit, nothing is admitted.
		rep := b.run(t, b.pool, "prompts.rejects", replay.Config{Limits: envelope.Limits{MaxValueBytes: 2048}}, replay.Bounds{})
		require.Zero(t, rep.Totals.Admitted)
		require.Equal(t, int64(2), rep.Totals.Malformed)
		require.Equal(t, int64(1), rep.Totals.Skipped)

		// After raising it, the large prompt is admitted with its original
		// source; the rest are reported with their reasons.
		rep = b.run(t, b.pool, "prompts.rejects", replay.Config{Limits: envelope.Limits{MaxValueBytes: 1 << 20}}, replay.Bounds{})
		require.Equal(t, int64(1), rep.Totals.Admitted)
		require.Equal(t, int64(1), rep.Totals.Malformed)
		require.Equal(t, int64(1), rep.Totals.Skipped)
		require.Equal(t, map[string]int64{"invalid_json": 1, "not_a_prompt": 1}, rep.Reasons)
		for _, j := range rep.Rejections {
			switch j.Reason {
			case "invalid_json":
				require.Equal(t, "invalid_json", j.OriginalReason)
				require.Equal(t, "prompts/1/7", j.Source)
			case "not_a_prompt":
				require.Equal(t, "unknown_request", j.OriginalReason)
			}
		}
		require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1 AND source_topic = 'prompts' AND source_partition = 2 AND source_offset = 40", big.MessageID))
	})

	t.Run("PublishRejects", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.sendRaw(t, "prompts", "s-x", []byte(`[]`), time.Time{})
		b.run(t, b.pool, "prompts", replay.Config{PublishRejects: true}, replay.Bounds{})
		rep := b.run(t, b.pool, "prompts.rejects", replay.Config{DryRun: true}, replay.Bounds{})
		require.Equal(t, int64(1), rep.Totals.Malformed)
		require.Equal(t, "invalid_json", rep.Rejections[0].OriginalReason)
	})
}

// manyHeaders returns n small headers.
func manyHeaders(n int) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, n)
	for i := range out {
		out[i] = sarama.RecordHeader{Key: fmt.Appendf(nil, "h-%d", i), Value: []byte("v")}
	}
	return out
}

// Replay applies the header limits live admission applies, and its rejects
// keep what live admission would have kept.
func TestReplayHeaders(t *testing.T) {
	t.Parallel()

	t.Run("TooManyHeadersIsMalformedAsLive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		crowded := prompt("s-h", "forty headers")
		b.sendRaw(t, "prompts", crowded.SessionID, value(t, crowded), time.Time{}, manyHeaders(40)...)
		heavy := prompt("s-h", "seventeen KiB of headers")
		b.sendRaw(t, "prompts", heavy.SessionID, value(t, heavy), time.Time{},
			sarama.RecordHeader{Key: []byte("big"), Value: make([]byte, 17<<10)})
		fine := prompt("s-h", "a few headers")
		b.sendRaw(t, "prompts", fine.SessionID, value(t, fine), time.Time{}, manyHeaders(3)...)

		rep := b.run(t, b.pool, "prompts", replay.Config{}, replay.Bounds{})
		require.Equal(t, int64(1), rep.Totals.Admitted)
		require.Equal(t, int64(2), rep.Totals.Malformed)
		require.Equal(t, map[string]int64{envelope.ReasonTooManyHeaders: 1, envelope.ReasonHeadersTooLarge: 1}, rep.Reasons)
		require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"))
		require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1", fine.MessageID))
	})

	t.Run("RejectKeepsTheOriginalHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		orig := []sarama.RecordHeader{{Key: []byte("trace-id"), Value: []byte("abc")}, {Key: []byte("reason"), Value: []byte("forged")}}
		b.sendRaw(t, "prompts", "s-x", []byte(`[]`), time.Time{}, orig...)
		b.run(t, b.pool, "prompts", replay.Config{PublishRejects: true}, replay.Bounds{})

		got := testkit.ReadAll(t, b.addr, "prompts.rejects")
		require.Len(t, got, 1)
		var keys, values []string
		for _, h := range got[0].Headers {
			keys, values = append(keys, string(h.Key)), append(values, string(h.Value))
		}
		require.Equal(t, []string{"reason", "detail", "source_topic", "source_partition", "source_offset", "trace-id", "reason"}, keys,
			"promptline's headers first, then the original's, unchanged")
		require.Equal(t, "invalid_json", values[0])
		require.Equal(t, []string{"abc", "forged"}, values[5:])

		// Replayed from the rejects topic, the first reason is promptline's.
		rep := b.run(t, b.pool, "prompts.rejects", replay.Config{DryRun: true}, replay.Bounds{})
		require.Equal(t, "invalid_json", rep.Rejections[0].OriginalReason)
	})

	// A reject that live admission published truncated holds a prefix of
	// the original: here a prefix that is itself a valid prompt. Replayed
	// from the rejects topic it is never admitted, whatever the limits.
	t.Run("TruncatedRejectIsNeverAdmitted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := prompt("s-t", "looks whole")
		b.sendRaw(t, "prompts.rejects", p.SessionID, value(t, p), time.Time{},
			sarama.RecordHeader{Key: []byte("reason"), Value: []byte(envelope.ReasonTooLarge)},
			sarama.RecordHeader{Key: []byte("source_topic"), Value: []byte("prompts")},
			sarama.RecordHeader{Key: []byte("source_partition"), Value: []byte("0")},
			sarama.RecordHeader{Key: []byte("source_offset"), Value: []byte("7")},
			sarama.RecordHeader{Key: []byte("original_value_bytes"), Value: []byte("2000000")},
			sarama.RecordHeader{Key: []byte("original_value_sha256"), Value: []byte("00")})

		rep := b.run(t, b.pool, "prompts.rejects", replay.Config{Limits: envelope.Limits{MaxValueBytes: 4 << 20}}, replay.Bounds{})
		require.Zero(t, rep.Totals.Admitted)
		require.Equal(t, map[string]int64{replay.ReasonTruncated: 1}, rep.Reasons)
		require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs"))
	})

	// Re-admitting a too_many_headers reject after raising the limit:
	// only the original's headers count, not the ones promptline added.
	t.Run("RejectsReplayCountsOnlyTheOriginalHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := prompt("s-r", "thirty-three headers")
		hdr := append([]sarama.RecordHeader{
			{Key: []byte("reason"), Value: []byte(envelope.ReasonTooManyHeaders)},
			{Key: []byte("detail"), Value: []byte("33 headers, limit 32")},
			{Key: []byte("source_topic"), Value: []byte("prompts")},
			{Key: []byte("source_partition"), Value: []byte("0")},
			{Key: []byte("source_offset"), Value: []byte("9")},
		}, manyHeaders(33)...)
		b.sendRaw(t, "prompts.rejects", p.SessionID, value(t, p), time.Time{}, hdr...)

		rep := b.run(t, b.pool, "prompts.rejects", replay.Config{}, replay.Bounds{})
		require.Zero(t, rep.Totals.Admitted)
		require.Equal(t, map[string]int64{envelope.ReasonTooManyHeaders: 1}, rep.Reasons)
		require.Equal(t, envelope.ReasonTooManyHeaders, rep.Rejections[0].OriginalReason)

		rep = b.run(t, b.pool, "prompts.rejects", replay.Config{Limits: envelope.Limits{MaxHeaders: 33}}, replay.Bounds{})
		require.Equal(t, int64(1), rep.Totals.Admitted)
		require.Equal(t, 1, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1 AND source_offset = 9", p.MessageID))
	})
}

// Transactional producers: replay reads committed data only, and a range
// whose last offsets are a transaction marker or aborted records (never
// delivered to a consumer) still finishes.
func TestReplayTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := kafkautil.NewConfig("replay-txn")
	cfg.Producer.Transaction.ID = "txn-" + t.Name()
	producer, err := sarama.NewSyncProducer([]string{b.addr}, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, producer.Close()) })

	inTxn := func(commit bool, ps ...envelope.Prompt) {
		t.Helper()
		require.NoError(t, producer.BeginTxn())
		for _, p := range ps {
			_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(p.SessionID), Value: sarama.ByteEncoder(value(t, p))})
			require.NoError(t, err)
		}
		if commit {
			require.NoError(t, producer.CommitTxn())
		} else {
			require.NoError(t, producer.AbortTxn())
		}
	}
	// One session: one partition, whose log ends on markers.
	committed := []envelope.Prompt{prompt("s-t", "one"), prompt("s-t", "two")}
	inTxn(true, committed...)
	aborted := prompt("s-t", "aborted")
	inTxn(false, aborted)

	ranges, err := replay.Resolve(b.client, "prompts", replay.Bounds{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var batches batchLog
	rep, err := b.replayer(t, b.pool, replay.Config{OnBatchFunc: batches.onBatch}).Run(ctx, "prompts", ranges)
	require.NoError(t, err)
	require.True(t, rep.Complete, "the range ends on a transaction marker: the replay finishes")
	require.False(t, rep.Interrupted)
	require.Equal(t, int64(2), rep.Totals.Admitted)
	require.Equal(t, int64(2), rep.Totals.Messages)
	require.Zero(t, testkit.Count(t, b.pool, "SELECT count(*) FROM inputs WHERE message_id = $1", aborted.MessageID))
	for _, p := range rep.Partitions {
		require.Equal(t, p.To, p.Next)
	}
	partition := rep.Partitions[slices.IndexFunc(rep.Partitions, func(p replay.PartitionReport) bool { return p.Messages > 0 })].Partition
	nexts := batches.of(partition)
	require.NotEmpty(t, nexts)
	require.Equal(t, int64(2), nexts[len(nexts)-1], "OnBatchFunc is told of batches of messages, not of the markers' end")

	// A range that ends right after a commit marker finishes too.
	rep, err = b.replayer(t, newPool(t), replay.Config{}).Run(ctx, "prompts", []replay.Range{{
		Partition: partition, From: 0, To: 3,
	}})
	require.NoError(t, err)
	require.True(t, rep.Complete)
	require.Equal(t, int64(2), rep.Totals.Admitted)

	// A range that ends on the abort marker, with a message after it: that
	// message is past the range and is not replayed.
	after := prompt("s-t", "after the range")
	p, o := b.sendRaw(t, "prompts", after.SessionID, value(t, after), time.Time{})
	require.Equal(t, partition, p)
	require.Equal(t, int64(5), o, "two prompts and their commit marker, an aborted prompt and its marker")
	fresh := newPool(t)
	rep, err = b.replayer(t, fresh, replay.Config{}).Run(ctx, "prompts", []replay.Range{{Partition: partition, From: 0, To: 5}})
	require.NoError(t, err)
	require.True(t, rep.Complete)
	require.Equal(t, int64(2), rep.Totals.Messages)
	require.Equal(t, int64(1), rep.Partitions[0].Last)
	require.Equal(t, int64(5), rep.Partitions[0].Next)
	require.Zero(t, testkit.Count(t, fresh, "SELECT count(*) FROM inputs WHERE message_id = $1", after.MessageID))
}

func TestParseOffsetSpec(t *testing.T) {
	t.Parallel()
	s, err := replay.ParseOffsetSpec("12")
	require.NoError(t, err)
	n, ok := s.For(3)
	require.True(t, ok)
	require.Equal(t, int64(12), n)

	s, err = replay.ParseOffsetSpec("0:5, 3:9")
	require.NoError(t, err)
	require.Equal(t, []int32{0, 3}, s.Partitions())
	_, ok = s.For(1)
	require.False(t, ok)
	require.Equal(t, "0:5,3:9", replay.FormatOffsets(map[int32]int64{3: 9, 0: 5}))

	for _, bad := range []string{"-1", "x", "0:", "0:1,0:2", "a:1"} {
		_, err := replay.ParseOffsetSpec(bad)
		require.Error(t, err, bad)
	}
	parts, err := replay.ParsePartitions("5,0,3,3")
	require.NoError(t, err)
	require.Equal(t, []int32{0, 3, 5}, parts)
}
