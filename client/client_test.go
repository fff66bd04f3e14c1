package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

const partitions = 4

type testBundle struct {
	addr string
	cfg  *client.Config
}

// setup gives a test a broker of its own (no consumer).
func setup(t *testing.T) *testBundle {
	t.Helper()
	addr := testkit.Broker(t, partitions).Addr()
	return &testBundle{addr: addr, cfg: &client.Config{Brokers: []string{addr}}}
}

// publishEvents writes events to session-events as the relay does: key =
// session ID, murmur2.
func (b *testBundle) publishEvents(t *testing.T, values ...[2]string) {
	t.Helper()
	b.publishAt(t, time.Time{}, values...)
}

// publishAt is publishEvents with the records' timestamp set to at (the
// producer's clock when zero).
func (b *testBundle) publishAt(t *testing.T, at time.Time, values ...[2]string) {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{b.addr}, kafkautil.NewConfig("test-events"))
	require.NoError(t, err)
	defer p.Close()
	for _, kv := range values {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "session-events", Key: sarama.StringEncoder(kv[0]), Value: sarama.StringEncoder(kv[1]), Timestamp: at})
		require.NoError(t, err)
	}
}

// publishTo writes values with their keys to topic.
func (b *testBundle) publishTo(t *testing.T, topic string, values ...[2]string) {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{b.addr}, kafkautil.NewConfig("test-publish"))
	require.NoError(t, err)
	defer p.Close()
	for _, kv := range values {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(kv[0]), Value: sarama.StringEncoder(kv[1])})
		require.NoError(t, err)
	}
}

func eventValue(t *testing.T, e envelope.Event) [2]string {
	t.Helper()
	if e.At.IsZero() {
		e.At = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	}
	v, err := json.Marshal(e)
	require.NoError(t, err)
	return [2]string{e.SessionID, string(v)}
}

func TestProducer(t *testing.T) {
	t.Parallel()

	t.Run("SendKeysAndPartitions", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		for _, s := range []string{"s-1", "21", "session-with-a-longer-id"} {
			pr := envelope.Prompt{MessageID: client.NewMessageID(), SessionID: s, Text: "hi " + s}
			part, off, err := p.Send(t.Context(), pr)
			require.NoError(t, err)
			require.Equal(t, client.Murmur2Partition([]byte(s), partitions), part, "session %s", s)
			var found bool
			for _, m := range testkit.ReadAll(t, b.addr, "prompts") {
				if m.Partition == part && m.Offset == off {
					found = true
					got, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
					require.NoError(t, err)
					require.Equal(t, pr.MessageID, got.MessageID)
				}
			}
			require.True(t, found)
		}
	})

	t.Run("InvalidPromptSendsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		part, off, err := p.Send(t.Context(), envelope.Prompt{SessionID: "s-1", Text: "no id"})
		require.Equal(t, []int64{-1, -1}, []int64{int64(part), off}, "nowhere")
		var rej *envelope.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonMissingField, rej.Reason)
		require.ErrorContains(t, err, `sending prompt "": missing_field: message_id is required (client.NewMessageID makes one)`)

		n, err := p.SendBatch(t.Context(), []envelope.Prompt{
			{MessageID: "m-1", SessionID: "s-1", Text: "one"},
			{MessageID: "m-2", SessionID: "s-1", Text: "two"},
			{MessageID: "m-1", SessionID: "s-1", Text: "other"},
		}, nil)
		require.Zero(t, n)
		var be *client.BatchError
		require.ErrorAs(t, err, &be)
		require.Equal(t, 2, be.Index)
		require.ErrorContains(t, err, "conflict: message_id is used by prompt 0 with another payload")

		part, off, err = p.Reply(t.Context(), "s-1", "r-1", envelope.ReplyOnce, "only with reject")
		require.Equal(t, []int64{-1, -1}, []int64{int64(part), off}, "nowhere")
		require.ErrorAs(t, err, &rej)
		// The key is the request's session: one no session can have.
		part, off, err = p.Reply(t.Context(), "s 1", "r-1", envelope.ReplyOnce, "")
		require.Equal(t, []int64{-1, -1}, []int64{int64(part), off}, "nowhere")
		require.ErrorAs(t, err, &rej)
		require.ErrorContains(t, err, "invalid_field: session_id has a non-printable or non-ASCII character at byte 1")
		require.Empty(t, testkit.ReadAll(t, b.addr, "prompts"))
		require.Empty(t, testkit.ReadAll(t, b.addr, "permission-replies"))
	})

	// A value within admission's 1 MiB can still make a record larger than
	// a record batch holds under Kafka's default max.message.bytes (its
	// key and the record's overhead): refused as too_large, naming the
	// sizes, where Sarama answered with a configuration error.
	t.Run("RecordTooLargeSendsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		prompt := envelope.Prompt{MessageID: "m-1", SessionID: "s-1", Text: strings.Repeat("x", 1<<20-100)}
		value, err := envelope.Marshal(prompt)
		require.NoError(t, err)
		_, err = envelope.Decode([]byte("s-1"), value, envelope.Limits{})
		require.NoError(t, err, "admission would take the value")
		var rej *envelope.RejectError
		_, _, err = p.Send(t.Context(), prompt)
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonTooLarge, rej.Reason)
		require.Contains(t, rej.Detail, fmt.Sprintf("over the %d a record batch holds", 1048588-61))
		n, err := p.SendBatch(t.Context(), []envelope.Prompt{{MessageID: "m-2", SessionID: "s-1", Text: "fine"}, prompt}, nil)
		require.Zero(t, n)
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonTooLarge, rej.Reason)
		// The largest that fits is sent.
		prompt.Text = prompt.Text[:len(prompt.Text)-200]
		_, _, err = p.Send(t.Context(), prompt)
		require.NoError(t, err)
		require.Len(t, testkit.ReadAll(t, b.addr, "prompts"), 1)
	})

	// json.Marshal would replace bytes that are not UTF-8 with U+FFFD and
	// send a text the caller never wrote; admission refuses such a value
	// (invalid_utf8), so Send and Reply refuse it too.
	t.Run("TextNotUTF8SendsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		latin1 := "caf\xe9"
		var rej *envelope.RejectError
		_, _, err = p.Send(t.Context(), envelope.Prompt{MessageID: "m-1", SessionID: "s-1", Text: latin1})
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonInvalidUTF8, rej.Reason)
		require.ErrorContains(t, err, "text")
		n, err := p.SendBatch(t.Context(), []envelope.Prompt{{MessageID: "m-2", SessionID: "s-1", Text: "fine"},
			{MessageID: "m-3", SessionID: "s-1", Text: latin1}}, nil)
		require.Zero(t, n)
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonInvalidUTF8, rej.Reason)
		_, _, err = p.Reply(t.Context(), "s-1", "r-1", envelope.ReplyReject, latin1)
		require.ErrorAs(t, err, &rej)
		require.Equal(t, envelope.ReasonInvalidUTF8, rej.Reason)
		require.ErrorContains(t, err, "message")
		require.Empty(t, testkit.ReadAll(t, b.addr, "prompts"))
		require.Empty(t, testkit.ReadAll(t, b.addr, "permission-replies"))
	})

	t.Run("SendBatchInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		var prompts []envelope.Prompt
		for i := range 40 {
			prompts = append(prompts, envelope.Prompt{MessageID: fmt.Sprintf("m-%03d", i), SessionID: fmt.Sprintf("s-%d", i%3), Text: fmt.Sprintf("%03d", i)})
		}
		var progress []int
		n, err := p.SendBatch(t.Context(), prompts, &client.SendBatchOpts{ProgressFunc: func(acked int) { progress = append(progress, acked) }})
		require.NoError(t, err)
		require.Equal(t, 40, n)
		require.Len(t, progress, 40)
		require.Equal(t, 40, progress[39])
		texts := map[string][]string{}
		for _, m := range testkit.ReadAll(t, b.addr, "prompts") {
			got, err := envelope.Decode(m.Key, m.Value, envelope.Limits{})
			require.NoError(t, err)
			texts[got.SessionID] = append(texts[got.SessionID], got.Text)
		}
		require.Len(t, texts, 3)
		for s, ts := range texts {
			require.IsIncreasing(t, ts, "session %s keeps batch order", s)
		}
	})

	// A batch whose ctx has ended sends nothing and says so: no prompt
	// was written, and the caller must not take the batch for sent.
	t.Run("SendBatchWithAnEndedContext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		defer p.Close()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		n, err := p.SendBatch(ctx, []envelope.Prompt{{MessageID: "m-1", SessionID: "s-1", Text: "x"}}, nil)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "sent 0 of 1 prompts")
		require.Zero(t, n)
		require.Empty(t, testkit.ReadAll(t, b.addr, "prompts"))
	})

	t.Run("ClosedProducer", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p, err := client.NewProducer(b.cfg)
		require.NoError(t, err)
		require.NoError(t, p.Close())
		require.NoError(t, p.Close(), "Close may be called twice")
		part, off, err := p.Send(t.Context(), envelope.Prompt{MessageID: "m-1", SessionID: "s-1", Text: "late"})
		require.ErrorIs(t, err, client.ErrClosed)
		require.Equal(t, []int64{-1, -1}, []int64{int64(part), off}, "nowhere")
		part, off, err = p.Reply(t.Context(), "s-1", "r-1", envelope.ReplyOnce, "")
		require.ErrorIs(t, err, client.ErrClosed)
		require.Equal(t, []int64{-1, -1}, []int64{int64(part), off}, "nowhere")
		_, err = p.SendBatch(t.Context(), []envelope.Prompt{{MessageID: "m-1", SessionID: "s-1", Text: "late"}}, nil)
		require.ErrorIs(t, err, client.ErrClosed)
	})

	t.Run("ConfigErrors", func(t *testing.T) {
		t.Parallel()
		_, err := client.NewProducer(nil)
		require.ErrorContains(t, err, "a Config with Brokers is required")
		_, err = client.NewProducer(&client.Config{Brokers: []string{" "}})
		require.ErrorContains(t, err, "Config.Brokers: want at least one host:port")
		_, err = client.NewWatcher(&client.Config{Brokers: []string{"127.0.0.1:1"}, Security: client.Security{SASLMechanism: "NOPE"}}, nil)
		require.ErrorContains(t, err, "configuring Kafka security: --sasl-mechanism")
	})
}

func TestWatcher(t *testing.T) {
	t.Parallel()

	t.Run("OneSessionDeduplicated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		done := eventValue(t, envelope.Event{ID: "e-2", Type: envelope.EventTurnCompleted, SessionID: "s-1", MessageIDs: []string{"m-1"}, Text: "echo: hi"})
		b.publishEvents(t,
			eventValue(t, envelope.Event{ID: "e-1", Type: envelope.EventInputAdmitted, SessionID: "s-1", MessageID: "m-1"}),
			done, done, // at least once: the repeat is dropped
			[2]string{"s-1", "not json"},
			eventValue(t, envelope.Event{ID: "o-1", Type: envelope.EventTurnCompleted, SessionID: "s-2", Text: "other"}),
			eventValue(t, envelope.Event{ID: "e-3", Type: envelope.EventTurnFailed, SessionID: "s-1", Reason: envelope.FailProviderError}),
		)
		var skipped []error
		w, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1", Start: client.StartOldest(), ErrorFunc: func(err error) { skipped = append(skipped, err) }})
		require.NoError(t, err)
		defer w.Close()
		require.Equal(t, []int32{client.Murmur2Partition([]byte("s-1"), partitions)}, w.Partitions())
		require.Equal(t, partitions, w.TopicPartitions())

		var ids []string
		for range 3 {
			e, err := w.Next(t.Context())
			require.NoError(t, err)
			ids = append(ids, e.ID)
		}
		require.Equal(t, []string{"e-1", "e-2", "e-3"}, ids)
		require.Len(t, skipped, 1)
		var derr *client.DecodeError
		require.ErrorAs(t, skipped[0], &derr)
	})

	// A filter no session can have would watch for nothing, silently; the
	// options are checked before any connection.
	t.Run("BadOptions", func(t *testing.T) {
		t.Parallel()
		cfg := &client.Config{Brokers: []string{"127.0.0.1:1"}}
		for _, tc := range []struct {
			opts *client.WatchOpts
			want string
		}{
			{&client.WatchOpts{SessionID: "s 1"}, "client: WatchOpts.SessionID: invalid_field: session_id has a non-printable or non-ASCII character at byte 1"},
			{&client.WatchOpts{DedupWindow: -1}, "client: WatchOpts.DedupWindow: want 0 or more, got -1"},
		} {
			w, err := client.NewWatcher(cfg, tc.opts)
			require.EqualError(t, err, tc.want)
			require.Nil(t, w)
		}
	})

	t.Run("Deltas", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		delta := func(session string, seq int64, text string) [2]string {
			v, err := json.Marshal(envelope.Delta{SessionID: session, TurnID: "a-1", AssistantMessageID: "a-1", Step: 1, Seq: seq, Text: text})
			require.NoError(t, err)
			return [2]string{session, string(v)}
		}
		b.publishTo(t, "session-deltas", delta("s-1", 1, "Hel"), delta("s-2", 1, "other"), [2]string{"s-1", `{"seq": 0}`}, delta("s-1", 2, "lo"))
		b.publishEvents(t, eventValue(t, envelope.Event{ID: "e-1", Type: envelope.EventStepCompleted, SessionID: "s-1", AssistantMessageID: "a-1", Text: "Hello"}))

		var skipped []error
		w, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1", Deltas: true, Start: client.StartOldest(),
			ErrorFunc: func(err error) { skipped = append(skipped, err) }})
		require.NoError(t, err)
		defer w.Close()
		require.Equal(t, []int32{client.Murmur2Partition([]byte("s-1"), partitions)}, w.DeltaPartitions())
		var texts []string
		var event string
		for range 3 {
			r, err := w.NextRecord(t.Context())
			require.NoError(t, err)
			if r.Delta == nil {
				event = r.Event.ID
				continue
			}
			require.Equal(t, "session-deltas", r.Topic)
			require.Equal(t, "s-1", r.Delta.SessionID)
			texts = append(texts, r.Delta.Text)
		}
		require.Equal(t, []string{"Hel", "lo"}, texts, "one session's deltas, in order")
		require.Equal(t, "e-1", event)
		require.Len(t, skipped, 1)
		require.ErrorContains(t, skipped[0], "not a delta")

		// Next skips deltas: a Watcher of events and deltas still waits
		// for events with it.
		b.publishTo(t, "session-deltas", delta("s-1", 3, "!"))
		b.publishEvents(t, eventValue(t, envelope.Event{ID: "e-2", Type: envelope.EventTurnCompleted, SessionID: "s-1", Text: "Hello!"}))
		e, err := w.Next(t.Context())
		require.NoError(t, err)
		require.Equal(t, "e-2", e.ID)
	})

	t.Run("WindowForgetsOldIDs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		e := func(id string) [2]string {
			return eventValue(t, envelope.Event{ID: id, Type: envelope.EventInputAdmitted, SessionID: "s-1"})
		}
		b.publishEvents(t, e("a"), e("b"), e("a"), e("c"), e("a"))
		w, err := client.NewWatcher(b.cfg, &client.WatchOpts{Start: client.StartOldest(), DedupWindow: 2})
		require.NoError(t, err)
		defer w.Close()
		var ids []string
		for range 4 {
			ev, err := w.Next(t.Context())
			require.NoError(t, err)
			ids = append(ids, ev.ID)
		}
		// The second "a" is within the window; after "c" pushed it out,
		// the third is seen again.
		require.Equal(t, []string{"a", "b", "c", "a"}, ids)
	})

	t.Run("StartNewestAndAtTime", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
		b.publishAt(t, t0, eventValue(t, envelope.Event{ID: "old", Type: envelope.EventInputAdmitted, SessionID: "s-1"}))
		newest, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1"})
		require.NoError(t, err)
		defer newest.Close()
		b.publishAt(t, t0.Add(time.Second), eventValue(t, envelope.Event{ID: "new", Type: envelope.EventInputAdmitted, SessionID: "s-1"}))
		since := t0.Add(500 * time.Millisecond)

		e, err := newest.Next(t.Context())
		require.NoError(t, err)
		require.Equal(t, "new", e.ID, "StartNewest sees what follows NewWatcher, not what preceded it")

		atTime, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1", Start: client.StartAtTime(since)})
		require.NoError(t, err)
		defer atTime.Close()
		e, err = atTime.Next(t.Context())
		require.NoError(t, err)
		require.Equal(t, "new", e.ID)

		// A time before every record starts at the first (offset 0), not
		// at the newest.
		before, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1", Start: client.StartAtTime(t0.Add(-time.Second))})
		require.NoError(t, err)
		defer before.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		e, err = before.Next(ctx)
		require.NoError(t, err)
		require.Equal(t, "old", e.ID)

		atOffset, err := client.NewWatcher(b.cfg, &client.WatchOpts{SessionID: "s-1", Start: client.StartAtOffset(1)})
		require.NoError(t, err)
		defer atOffset.Close()
		r, err := atOffset.NextRecord(t.Context())
		require.NoError(t, err)
		require.Equal(t, "new", r.Event.ID)
		require.Equal(t, int64(1), r.Offset)
	})

	t.Run("CloseStopsNext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		w, err := client.NewWatcher(b.cfg, nil)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			_, err := w.Next(t.Context())
			got <- err
		}()
		require.NoError(t, w.Close())
		require.NoError(t, w.Close(), "Close may be called twice")
		require.True(t, errors.Is(<-got, client.ErrClosed))
	})
}
