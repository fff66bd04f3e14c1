package pipeline_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// A session's run lasts while its prompts keep arriving, and a wake's
// offset is committed only once its session has gone idle. Such a run must
// hold the wakes partition's committed offset, never the partition: the
// wakes after it are still handed over, however many (the consumer once
// kept at most 1,024 wakes waiting for their sessions, and then stopped
// reading the partition until the run at their head ended).
func TestWakesPartitionNotHeldByALongRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noLocalWakes: true, maxSessions: 64})

	// The long run: each turn sleeps, and the next prompts are admitted
	// long before it ends.
	chatty := id(t, "chatty")
	part := kafkautil.Murmur2Partition([]byte(chatty), testPartitions)
	var (
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	send := func(i int) {
		b.send(t, envelope.Prompt{MessageID: fmt.Sprintf("%s-%d", chatty, i), SessionID: chatty, Text: "/sleep 1s"})
	}
	send(0)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				send(i)
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
	var execution string
	require.Eventually(t, func() bool {
		return b.pool.QueryRow(t.Context(), `SELECT execution_id FROM claims WHERE session_id = $1`, chatty).Scan(&execution) == nil
	}, 20*time.Second, 10*time.Millisecond, "the long run starts")

	// More sessions on the same wakes partition than the old bound, each
	// answered at once.
	const others = 1100
	var msgs []*sarama.ProducerMessage
	var last string
	for i := 0; len(msgs) < others; i++ {
		s := id(t, fmt.Sprintf("s%d", i))
		if kafkautil.Murmur2Partition([]byte(s), testPartitions) != part {
			continue
		}
		last = s + "-m"
		v, err := envelope.Marshal(envelope.Prompt{MessageID: last, SessionID: s, Text: "hi"})
		require.NoError(t, err)
		msgs = append(msgs, &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(s), Value: sarama.ByteEncoder(v)})
	}
	require.NoError(t, b.producer.SendMessages(msgs))
	require.Equal(t, "echo: hi", b.events.WaitTurn(t, last, 60*time.Second).Text,
		"a session behind the long run on its wakes partition was not run")
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'completed' AND session_id <> $1`, chatty) == others
	}, 30*time.Second, 50*time.Millisecond)

	// The long run was one run throughout: its claim never left.
	var now string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT execution_id FROM claims WHERE session_id = $1`, chatty).Scan(&now))
	require.Equal(t, execution, now, "the long run ended while the others ran: the test proved nothing")
	// And it held the committed offset at its first wake, the
	// partition's first message: a crash now would deliver it again.
	require.LessOrEqual(t, b.committedOn(t, "wakes", part), int64(0), "a wake committed while its session still runs")
}

// committedOn returns the group's committed offset of topic's partition
// p (-1: none).
func (b *testBundle) committedOn(t *testing.T, topic string, p int32) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(b.brokers, kafkautil.NewConfig(t.Name()+"-admin"))
	require.NoError(t, err)
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets("test", map[string][]int32{topic: {p}})
	require.NoError(t, err)
	blk := res.GetBlock(topic, p)
	require.NotNil(t, blk)
	return blk.Offset
}

// A session with many prompts queued must not keep every slot: once its
// run has had its fair share and another session waits for a slot, it
// hands its session back (released with a wake, as a stopping run does)
// and the waiting session runs. The long session's prompts are all sent
// first, so that only the release's wake can run the rest of them.
func TestALongRunYieldsItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxSessions: 1, fairShare: 500 * time.Millisecond})

	long := id(t, "long")
	const n = 12 // 3.6 s of turns
	var sent []string
	for i := range n {
		msg := fmt.Sprintf("%s-%d", long, i)
		sent = append(sent, msg)
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: long, Text: "/sleep 300ms", Delivery: envelope.DeliveryQueue})
	}
	var first string
	require.Eventually(t, func() bool {
		return b.pool.QueryRow(t.Context(), `SELECT execution_id FROM claims WHERE session_id = $1`, long).Scan(&first) == nil
	}, 20*time.Second, 10*time.Millisecond, "the long run starts")
	// Alone, it keeps its slot past its fair share (three turns of 300
	// ms against 500 ms): no one waits.
	require.Equal(t, envelope.EventTurnCompleted, b.events.WaitTurn(t, sent[2], 20*time.Second).Type)
	var still string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT execution_id FROM claims WHERE session_id = $1`, long).Scan(&still))
	require.Equal(t, first, still, "a run handed its session back while no one waited")

	other := id(t, "other")
	b.send(t, envelope.Prompt{MessageID: other, SessionID: id(t, "s"), Text: "hi"})
	require.Equal(t, "echo: hi", b.events.WaitTurn(t, other, 20*time.Second).Text,
		"the other session never got the only slot")
	require.Less(t, b.events.Turns(t, sent[n-1]), 1, "the long run ended before it handed its session back: the test proved nothing")
	// The release's wake ran the rest, under a new execution.
	for _, msg := range sent {
		require.Equal(t, envelope.EventTurnCompleted, b.events.WaitTurn(t, msg, 30*time.Second).Type, msg)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes' AND key = $1 AND convert_from(payload, 'UTF8')::jsonb ->> 'reason' = 'released'`, long),
		"the hand-back's wake")
	require.Equal(t, 2, b.count(t, `SELECT count(DISTINCT execution_id) FROM messages WHERE session_id = $1 AND role = 'assistant'`, long))
}

// Wakes are internal hints: one that does not decode, or names no session,
// is skipped and counted "invalid", and its offset is committed at once
// (nothing runs for it); the partition goes on to the wakes behind it.
func TestInvalidWakesAreSkipped(t *testing.T) {
	t.Parallel()
	wakes := &testkit.Counts{}
	b := setup(t, setupOpts{wakes: wakes, noLocalWakes: true})
	key := []byte(id(t, "s"))
	part := kafkautil.Murmur2Partition(key, testPartitions)
	b.kafka.Send(t, "wakes", key, []byte("not json"))
	b.kafka.Send(t, "wakes", key, []byte(`{"reason":"admitted"}`))
	// A prompt of the same session: its wake comes after the two.
	msg := id(t, "m")
	b.send(t, envelope.Prompt{MessageID: msg, SessionID: string(key), Text: "hello"})
	require.Equal(t, "echo: hello", b.waitTurn(t, msg).Text)
	require.Eventually(t, func() bool { return b.committedOn(t, "wakes", part) == 3 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 2, wakes.Get("invalid"))
	require.Equal(t, 1, wakes.Get("started"))
}
