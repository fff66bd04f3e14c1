package pipeline_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// A prompt admitted for a session whose wakes partition this process owns
// runs at once from a local wake; its wake, arriving from Kafka later, is
// recognised as the same one: it starts no second run, and its offset is
// committed once the local run has gone idle.
func TestLocalWake(t *testing.T) {
	t.Parallel()

	t.Run("RunsOnceAndTakesItsWakeFromKafka", func(t *testing.T) {
		t.Parallel()
		wakes, started := &testkit.Counts{}, &wakeLatencies{}
		began := time.Now()
		b := setup(t, setupOpts{wakes: wakes, wakeStarted: started})
		const n = 3
		var msgs []string
		for i := range n {
			sess, msg := id(t, "s"+string(rune('a'+i))), id(t, "m"+string(rune('a'+i)))
			b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "hello"})
			msgs = append(msgs, msg)
		}
		for _, msg := range msgs {
			require.Equal(t, "echo: hello", b.waitTurn(t, msg).Text)
		}
		// Every wake came back from Kafka and was matched to its local run
		// (a wrong partition or a changed payload would start a second run).
		require.Eventually(t, func() bool {
			return wakes.Get("local") == n
		}, 10*time.Second, 10*time.Millisecond, "the wakes from Kafka were not taken by the local runs")
		require.Equal(t, n, wakes.Get("started"))
		require.Zero(t, wakes.Get("coalesced"))
		requireWakeLatencies(t, started, n, time.Since(began)) // the local starts; their wakes from Kafka started nothing
		require.Equal(t, n, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'completed'`))
		// And their offsets are committed: a restart would not run them again.
		require.Eventually(t, func() bool { return b.committedWakes(t) == n }, 10*time.Second, 50*time.Millisecond)
	})

	t.Run("DeclinedWhileEverySlotIsBusy", func(t *testing.T) {
		t.Parallel()
		wakes := &testkit.Counts{}
		b := setup(t, setupOpts{wakes: wakes, maxSessions: 1})
		slow, quick := id(t, "slow"), id(t, "quick")
		b.send(t, envelope.Prompt{MessageID: slow, SessionID: id(t, "s1"), Text: "/sleep 3s\n/reply slow"})
		// The slow turn holds the only slot before the second prompt is
		// sent (sent together, the two land on different partitions and
		// either may be admitted first).
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, id(t, "s1")) == 1
		}, 10*time.Second, 5*time.Millisecond, "the slow turn runs")
		// Its wake came back from Kafka and joined the local run; its
		// offset is not committed while that run goes. The second prompt's
		// offset, marked once admitted, is committed by a commit of the
		// group made after the wake was taken: by then a wrong mark of the
		// wake would be committed too.
		require.Eventually(t, func() bool { return wakes.Get("local") == 1 }, 10*time.Second, 5*time.Millisecond)
		v, err := envelope.Marshal(envelope.Prompt{MessageID: quick, SessionID: id(t, "s2"), Text: "/reply quick"})
		require.NoError(t, err)
		qp, qo, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(id(t, "s2")), Value: sarama.ByteEncoder(v)})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return b.committedOn(t, "prompts", qp) > qo }, 10*time.Second, 10*time.Millisecond,
			"the second prompt's offset is committed")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, id(t, "s1")), "the slow turn ended too soon: the test proved nothing")
		require.LessOrEqual(t, b.committedOn(t, "wakes", kafkautil.Murmur2Partition([]byte(id(t, "s1")), testPartitions)), int64(0),
			"a local run's wake committed while it runs")
		// The second session found the only slot taken: it waited for its
		// wake from Kafka, and still ran.
		require.Equal(t, "slow", b.waitTurn(t, slow).Text)
		require.Equal(t, "quick", b.waitTurn(t, quick).Text)
		require.Eventually(t, func() bool { return b.committedWakes(t) == 2 }, 10*time.Second, 50*time.Millisecond)
		require.Equal(t, 1, wakes.Get("local"))
		require.Equal(t, 2, wakes.Get("started"))
	})

	t.Run("OffWithoutThePartitionCount", func(t *testing.T) {
		t.Parallel()
		wakes, started := &testkit.Counts{}, &wakeLatencies{}
		began := time.Now()
		b := setup(t, setupOpts{wakes: wakes, noLocalWakes: true, wakeStarted: started})
		msg := id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: id(t, "s"), Text: "hello"})
		require.Equal(t, "echo: hello", b.waitTurn(t, msg).Text)
		require.Zero(t, wakes.Get("local"))
		require.Equal(t, 1, wakes.Get("started"))
		requireWakeLatencies(t, started, 1, time.Since(began)) // from Kafka
	})
}

// committedWakes is the sum of the offsets the test group committed on the
// wakes topic: the number of wakes it has marked.
func (b *testBundle) committedWakes(t *testing.T) int64 {
	t.Helper()
	var sum int64
	for p := range int32(testPartitions) {
		sum += max(b.committedOn(t, "wakes", p), 0)
	}
	return sum
}

// requireWakeLatencies checks that OnWakeStartedFunc was told of n starts,
// each with a time since its wake's at that is no longer than the test.
func requireWakeLatencies(t *testing.T, started *wakeLatencies, n int, within time.Duration) {
	t.Helper()
	// Told right after the run started, which the turn's event follows:
	// waited for all the same.
	require.Eventually(t, func() bool { return len(started.all()) >= n }, 10*time.Second, 5*time.Millisecond)
	got := started.all()
	require.Len(t, got, n, "OnWakeStartedFunc: %v", got)
	for _, d := range got {
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, within)
	}
}
