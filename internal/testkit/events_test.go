package testkit_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// TestSessionEvents: a session's events come back in the order written,
// decoded, filtered by type; other sessions' events and other topics are
// not read; a payload that does not decode fails the test.
func TestSessionEvents(t *testing.T) {
	t.Parallel()
	pool, _ := testkit.Pool(t)
	write := func(topic, key, payload string) {
		_, err := pool.Exec(t.Context(), `INSERT INTO outbox (topic, key, payload) VALUES ($1, $2, $3)`, topic, key, []byte(payload))
		require.NoError(t, err)
	}
	write("session-events", "s", `{"id":"input.admitted:m1","type":"input.admitted","session_id":"s","message_id":"m1"}`)
	write("session-events", "other", `{"id":"input.admitted:m9","type":"input.admitted","session_id":"other","message_id":"m9"}`)
	write("wakes", "s", `{"session_id":"s","reason":"admitted"}`)
	write("session-events", "s", `{"id":"turn.completed:a1","type":"turn.completed","session_id":"s","message_ids":["m1"]}`)
	write("session-events", "s", `{"id":"input.admitted:m2","type":"input.admitted","session_id":"s","message_id":"m2"}`)

	ids := func(events []envelope.Event) []string {
		var out []string
		for _, e := range events {
			out = append(out, e.ID)
		}
		return out
	}
	require.Equal(t, []string{"input.admitted:m1", "turn.completed:a1", "input.admitted:m2"}, ids(testkit.SessionEvents(t, pool, "s")))
	require.Equal(t, []string{"input.admitted:m1", "input.admitted:m2"}, ids(testkit.SessionEvents(t, pool, "s", envelope.EventInputAdmitted)))
	require.Equal(t, []string{"input.admitted:m1", "turn.completed:a1", "input.admitted:m2"},
		ids(testkit.SessionEvents(t, pool, "s", envelope.EventInputAdmitted, envelope.EventTurnCompleted)))
	require.Equal(t, []string{"m1"}, testkit.SessionEvents(t, pool, "s", envelope.EventTurnCompleted)[0].MessageIDs)
	require.Equal(t, 2, testkit.CountEvents(t, pool, "s", envelope.EventInputAdmitted))
	require.Zero(t, testkit.CountEvents(t, pool, "s", envelope.EventTurnFailed))
	require.Empty(t, testkit.SessionEvents(t, pool, "nobody"))

	write("session-events", "s", `{"id":`)
	fatal := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testkit.SessionEvents(fatal, pool, "s")
	}()
	<-done
	require.Contains(t, fatal.msg, "does not decode", "a payload that is no event fails the test")
}

// fatalTB records a Fatalf and ends its goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
