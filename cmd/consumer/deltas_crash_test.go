package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// TestCrashWhileStreaming: the promise is "a crash loses deltas, never the
// answer". A consumer streaming a step is SIGKILLed once a delta of the
// step has been read from session-deltas, so some of the text went out
// while the step's response was not committed (the attempt's intent was).
// A second consumer recovers the session; what the deltas showed never
// contradicts what is committed, and nothing is answered twice.
func TestCrashWhileStreaming(t *testing.T) {
	t.Parallel()

	crash := func(t *testing.T, extra ...string) (*testBundle, *streamServer, *topicReader, envelope.Prompt) {
		b := setup(t)
		deltas := readTopic(t, b.addr, "session-deltas")
		session := "s-crash-stream-" + t.Name()[strings.LastIndex(t.Name(), "/")+1:]
		// 20 fragments 150 ms apart: 3 s of streaming, far longer than it
		// takes to read the first delta and kill.
		srv := newStreamServer(t, words(20), 150*time.Millisecond)
		crashing := b.startStreaming(t, "consumer-1", srv, append([]string{"--lease", "1s"}, extra...)...)
		p := prompt(session, "stream please")
		b.send(t, p)
		require.Eventually(t, func() bool { return len(deltasOf(t, deltas, session)) > 0 },
			30*time.Second, 5*time.Millisecond, "a delta of the streaming step")
		require.NoError(t, crashing.cmd.Process.Signal(syscall.SIGKILL))
		requireKilled(t, crashing.waitExit(t, crashTimeout))

		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'`, session),
			"killed after the attempt's intent, before its response")
		require.Zero(t, testkit.CountEvents(t, b.pool, session, envelope.EventStepCompleted), "the step had not committed")
		require.Len(t, srv.requestKeys(), 1)

		b.startStreaming(t, "consumer-2", srv, append(append([]string{}, recoveryFlags...), extra...)...)
		return b, srv, deltas, p
	}

	t.Run("OutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		b, srv, deltas, p := crash(t)
		session := p.SessionID

		// The provider does not honour idempotency keys: the attempt is
		// reconciled, never sent again.
		turn := b.events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnFailed, turn.Type, "%+v", turn)
		require.Equal(t, envelope.FailOutcomeUnknown, turn.Reason)
		require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "one outcome")
		require.Len(t, srv.requestKeys(), 1, "not replayed")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'unknown'`, session))
		require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'errored'`, p.MessageID))
		require.Zero(t, testkit.CountEvents(t, b.pool, session, envelope.EventStepCompleted), "no text committed")

		// The deltas seen are a beginning of the answer the server was
		// streaming, all of the errored message (which turn.failed names):
		// a UI drops them at turn.failed, and they never claimed more.
		ds := deltasOf(t, deltas, session)
		require.NotEmpty(t, ds)
		for _, d := range ds {
			require.Equal(t, turn.AssistantMessageID, d.AssistantMessageID)
		}
		texts := sendings(ds)
		require.Len(t, texts, 1)
		require.True(t, strings.HasPrefix(srv.answer, texts[0]), "%q is not a beginning of %q", texts[0], srv.answer)
		require.Less(t, len(texts[0]), len(srv.answer), "killed before the whole text went out")
	})

	t.Run("IdempotentProviderAnswersOnce", func(t *testing.T) {
		t.Parallel()
		b, srv, deltas, p := crash(t, "--provider-honours-idempotency-keys")
		session := p.SessionID

		// The provider honours idempotency keys: recovery sends the
		// attempt again with its key and the answer is committed once.
		turn := b.events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
		require.Equal(t, srv.answer, turn.Text)
		require.Equal(t, 1, distinctIDs(b.events.turnEvents(t, p.MessageID)), "answered once")
		keys := srv.requestKeys()
		require.Len(t, keys, 2)
		require.NotEmpty(t, keys[0])
		require.Equal(t, keys[0], keys[1], "sent again with its key")
		require.Equal(t, 1, b.count(t, assistantAnswering+` AND status = 'completed'`, p.MessageID), "one answer")
		require.Equal(t, 1, testkit.CountEvents(t, b.pool, session, envelope.EventStepCompleted))

		// Every sending's deltas are a beginning of the answer; the last
		// sending's (seq from 1 again) are the whole answer.
		var texts []string
		require.Eventually(t, func() bool {
			texts = sendings(deltasOf(t, deltas, session))
			return len(texts) == 2 && texts[1] == srv.answer
		}, 20*time.Second, 20*time.Millisecond, "the resent step's deltas")
		require.True(t, strings.HasPrefix(srv.answer, texts[0]), "%q is not a beginning of %q", texts[0], srv.answer)
	})
}
