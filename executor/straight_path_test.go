package executor_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
)

func TestStraightPath(t *testing.T) {
	t.Parallel()

	t.Run("PromptProducesAdmittedAndCompleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess, msg := id(t, "s"), id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "hello"})

		turn := b.waitTurn(t, msg)
		require.Equal(t, envelope.EventTurnCompleted, turn.Type)
		require.Equal(t, "echo: hello", turn.Text)
		require.Equal(t, sess, turn.SessionID)
		require.NotEmpty(t, turn.AssistantMessageID)

		var admitted []envelope.Event
		for _, e := range b.events.Events(t) {
			if e.Type == envelope.EventInputAdmitted && e.MessageID == msg {
				admitted = append(admitted, e)
			}
		}
		require.NotEmpty(t, admitted)
		require.Equal(t, "input.admitted:"+msg, admitted[0].ID)
		// Event keys are the session: consumers get a session's events in order.
		for _, m := range b.events.All() {
			require.Equal(t, sess, string(m.Key))
		}
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'completed' AND $1 = ANY(answers)`, msg))
	})

	t.Run("DuplicateDeliveryRunsOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess, msg := id(t, "s"), id(t, "m")
		p := envelope.Prompt{MessageID: msg, SessionID: sess, Text: "once"}
		b.send(t, p)
		b.send(t, p)
		b.waitTurn(t, msg)
		// A later prompt of the same session, same partition: once it ran,
		// both deliveries of the first have been admitted.
		later := id(t, "later")
		b.send(t, envelope.Prompt{MessageID: later, SessionID: sess, Text: "later"})
		b.waitTurn(t, later)

		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msg))
		require.Equal(t, 1, b.turnsFor(t, msg))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND $1 = ANY(answers)`, msg))
	})

	t.Run("ConflictingReuseIsRejectedAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess, other, msg := id(t, "s"), id(t, "other"), id(t, "m")
		// The original waits unpromoted, without a wake (resume false): a
		// conflict that armed it, or changed it, would show.
		no := false
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "original", Resume: &no})
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msg) == 1
		}, 20*time.Second, 10*time.Millisecond)
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "impostor"})
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: other, Text: "original"}) // another session's reuse

		require.Eventually(t, func() bool { return len(b.rejects.All()) == 2 }, 20*time.Second, 10*time.Millisecond)
		var keys []string
		for _, r := range b.rejects.All() {
			require.Equal(t, envelope.ReasonConflict, testkit.Header(r, "reason"))
			require.Equal(t, "prompts", testkit.Header(r, "source_topic"))
			keys = append(keys, string(r.Key))
		}
		require.ElementsMatch(t, []string{sess, other}, keys)
		require.Contains(t, string(b.rejects.All()[slices.Index(keys, sess)].Value), "impostor")

		var text string
		var armed, promoted bool
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT text, wake_pending, promotion_seq IS NOT NULL FROM inputs WHERE message_id = $1`, msg).
			Scan(&text, &armed, &promoted))
		require.Equal(t, []any{"original", false, false}, []any{text, armed, promoted}, "invariant 2: no payload change, no wake armed")
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`), "no wake written")
		require.Zero(t, b.count(t, `SELECT count(*) FROM sessions WHERE session_id = $1`, other), "the other session's row is not created")

		// The original is intact: its exact retry asking to resume runs it.
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "original"})
		require.Equal(t, "echo: original", b.waitTurn(t, msg).Text)
		require.Equal(t, 1, b.turnsFor(t, msg))
	})

	t.Run("ResumeFalseThenExactRetryRunsOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess, msg := id(t, "s"), id(t, "m")
		no := false
		p := envelope.Prompt{MessageID: msg, SessionID: sess, Text: "later please", Resume: &no}
		b.send(t, p)
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msg) == 1
		}, 20*time.Second, 10*time.Millisecond)
		// Invariant 3: admitted without a wake.
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1`, sess))
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1 AND (wake_pending OR promotion_seq IS NOT NULL)`, msg))

		p.Resume = nil // exact retry, resume defaults to true
		b.send(t, p)
		turn := b.waitTurn(t, msg)
		require.Equal(t, "echo: later please", turn.Text)
		b.send(t, p) // a third delivery arms nothing: already promoted
		later := id(t, "later")
		b.send(t, envelope.Prompt{MessageID: later, SessionID: sess, Text: "x"})
		b.waitTurn(t, later)
		require.Equal(t, 1, b.turnsFor(t, msg))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, msg))
	})

	t.Run("MalformedGoToRejectsAndThePartitionMovesOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{limits: envelope.Limits{MaxValueBytes: 1024}})
		sess := id(t, "s")
		key := []byte(sess) // one key: all land on one partition, in order
		b.sendRaw(t, key, []byte(`{"message_id": "x", "session_id": `))
		b.sendRaw(t, key, mustJSON(map[string]string{"message_id": id(t, "nt"), "session_id": sess}))
		b.sendRaw(t, key, mustJSON(map[string]string{"message_id": id(t, "big"), "session_id": sess, "text": strings.Repeat("a", 2048)}))
		b.sendRaw(t, key, mustJSON(map[string]string{"message_id": id(t, "km"), "session_id": "someone-else", "text": "hi"}))
		ok := id(t, "ok")
		b.send(t, envelope.Prompt{MessageID: ok, SessionID: sess, Text: "still here"})

		require.Equal(t, "echo: still here", b.waitTurn(t, ok).Text)
		require.Eventually(t, func() bool { return len(b.rejects.All()) == 4 }, 20*time.Second, 10*time.Millisecond)
		rs := b.rejects.All()
		var reasons []string
		for _, r := range rs {
			reasons = append(reasons, testkit.Header(r, "reason"))
			require.Equal(t, sess, string(r.Key))
			require.Equal(t, "prompts", testkit.Header(r, "source_topic"))
			require.NotEmpty(t, testkit.Header(r, "source_partition"))
			require.NotEmpty(t, testkit.Header(r, "detail"))
		}
		require.Equal(t, []string{envelope.ReasonInvalidJSON, envelope.ReasonMissingField, envelope.ReasonTooLarge, envelope.ReasonKeyMismatch}, reasons)
		require.Equal(t, `{"message_id": "x", "session_id": `, string(rs[0].Value), "the original bytes")
		offsets := []string{testkit.Header(rs[0], "source_offset"), testkit.Header(rs[1], "source_offset"), testkit.Header(rs[2], "source_offset"), testkit.Header(rs[3], "source_offset")}
		require.Equal(t, []string{"0", "1", "2", "3"}, offsets)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1`, sess))
	})

	t.Run("SteerIsPromotedBeforeWaitingQueuedInput", func(t *testing.T) {
		t.Parallel()
		gate := newGatedProvider()
		b := setup(t, setupOpts{provider: gate})
		sess := id(t, "s")
		q1, q2, s1 := id(t, "q1"), id(t, "q2"), id(t, "steer")
		b.send(t, envelope.Prompt{MessageID: q1, SessionID: sess, Text: "first"})
		<-gate.started // q1's turn is at the provider
		b.send(t, envelope.Prompt{MessageID: q2, SessionID: sess, Text: "second"})
		b.send(t, envelope.Prompt{MessageID: s1, SessionID: sess, Text: "steer", Delivery: envelope.DeliverySteer})
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1`, sess) == 3
		}, 20*time.Second, 10*time.Millisecond)
		close(gate.release)

		b.waitTurn(t, q2)
		var order []string
		rows, err := b.pool.Query(context.Background(), `SELECT message_id FROM inputs WHERE session_id = $1 ORDER BY promotion_seq`, sess)
		require.NoError(t, err)
		for rows.Next() {
			var m string
			require.NoError(t, rows.Scan(&m))
			order = append(order, m)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{q1, s1, q2}, order)
		// The steer got its own turn, ahead of the queue.
		require.Equal(t, []string{s1}, b.waitTurn(t, s1).MessageIDs)
	})

	t.Run("ProviderFailureEmitsTurnFailedAndBadToolCallsGoBackToTheModel", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess := id(t, "s")
		f, tool := id(t, "fail"), id(t, "tool")
		b.send(t, envelope.Prompt{MessageID: f, SessionID: sess, Text: "/fail model on fire"})
		b.send(t, envelope.Prompt{MessageID: tool, SessionID: sess, Text: `/tool echo {"x":1}`})
		e := b.waitTurn(t, f)
		require.Equal(t, envelope.EventTurnFailed, e.Type)
		require.Equal(t, envelope.FailProviderError, e.Reason)
		require.Contains(t, e.Error, "model on fire")
		// An unknown tool is a failed call returned to the model, not a crash.
		e = b.waitTurn(t, tool)
		require.Equal(t, envelope.EventTurnCompleted, e.Type)
		require.Contains(t, e.Text, "invalid tool call")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = $1 AND state = 'failed'`, sess))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE session_id = $1 AND status = 'errored'`, sess))
	})

	t.Run("TranscriptReachesTheProvider", func(t *testing.T) {
		t.Parallel()
		rec := &recordingProvider{}
		b := setup(t, setupOpts{provider: rec})
		sess := id(t, "s")
		m1, m2 := id(t, "1"), id(t, "2")
		b.send(t, envelope.Prompt{MessageID: m1, SessionID: sess, Text: "one"})
		b.waitTurn(t, m1)
		b.send(t, envelope.Prompt{MessageID: m2, SessionID: sess, Text: "two"})
		b.waitTurn(t, m2)
		last := rec.last()
		require.Len(t, last.Messages, 3)
		require.Equal(t, []string{"user", "assistant", "user"}, []string{last.Messages[0].Role, last.Messages[1].Role, last.Messages[2].Role})
		require.Equal(t, "one", last.Messages[0].Text)
		require.Equal(t, "recorded", last.Messages[1].Text)
		require.Equal(t, "two", last.Messages[2].Text)
	})
}

// gatedProvider holds its first call until release is closed.
type gatedProvider struct {
	started chan struct{}
	release chan struct{}
	once    chan struct{}
}

func newGatedProvider() *gatedProvider {
	g := &gatedProvider{started: make(chan struct{}), release: make(chan struct{}), once: make(chan struct{}, 1)}
	g.once <- struct{}{}
	return g
}

func (g *gatedProvider) Complete(ctx context.Context, req provider.Request) (provider.Response, error) {
	select {
	case <-g.once:
		close(g.started)
		select {
		case <-g.release:
		case <-ctx.Done():
			return provider.Response{}, ctx.Err()
		}
	default:
	}
	return scripted.ScriptedProvider{}.Complete(ctx, req)
}

type recordingProvider struct {
	mu   sync.Mutex
	reqs []provider.Request
}

func (r *recordingProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	return provider.Response{Text: "recorded"}, nil
}

func (r *recordingProvider) last() provider.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}
