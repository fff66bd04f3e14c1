package testkit_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// TestTopicReader: a reader sees what was on the topic before it started
// and what comes after, on every partition; Turns counts a turn published
// twice once; a session event not keyed by its session, or a record that
// is no event, fails the test.
func TestTopicReader(t *testing.T) {
	t.Parallel()
	broker := testkit.Broker(t, 4)
	kc := testkit.NewKafkaClient(t, []string{broker.Addr()})
	turn := []byte(`{"id":"turn.completed:a1","type":"turn.completed","session_id":"s1","message_ids":["m1"]}`)
	kc.Send(t, "session-events", []byte("s1"), turn)
	r := testkit.ReadTopic(t, kc.Brokers, "session-events", nil)
	for _, s := range []string{"s2", "s3", "s4"} {
		kc.Send(t, "session-events", []byte(s), []byte(`{"id":"input.admitted:m-`+s+`","type":"input.admitted","session_id":"`+s+`","message_id":"m-`+s+`"}`))
	}
	kc.Send(t, "session-events", []byte("s1"), turn)

	require.Equal(t, "turn.completed:a1", r.WaitTurn(t, "m1", 10*time.Second).ID)
	require.Eventually(t, func() bool { return r.Len() == 5 }, 10*time.Second, 10*time.Millisecond)
	require.Len(t, r.Arrivals(), 5)
	require.Len(t, r.Since(3), 2)
	require.Len(t, r.Events(t), 5)
	require.Len(t, r.TurnEvents(t, "m1"), 2, "duplicates included")
	require.Equal(t, 1, r.Turns(t, "m1"), "distinct by event ID")
	require.Zero(t, r.Turns(t, "m-s2"))

	// A topic of its own for each bad record.
	fails := func(topic, key string, value []byte) string {
		kc.Send(t, topic, []byte(key), value)
		bad := testkit.ReadTopic(t, kc.Brokers, topic, nil)
		require.Eventually(t, func() bool { return bad.Len() == 1 }, 10*time.Second, 10*time.Millisecond)
		fatal := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			bad.Events(fatal)
		}()
		<-done
		return fatal.msg
	}
	require.Contains(t, fails("wakes", "s9", []byte(`{"id":"input.admitted:x","type":"input.admitted","session_id":"s1","message_id":"x"}`)),
		"an event's key is its session")
	require.Contains(t, fails("prompts.rejects", "s1", []byte(`{"id":`)), `session event {"id":`)
}
