package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/eapache/go-resiliency/breaker"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// refusingProducer is the test's real producer, except that it refuses
// the messages refuse picks, with the error refuse gives, before they
// reach the broker: the refusals a real cluster gives (an ACL revoked on
// one topic, an open circuit breaker) without building that cluster.
type refusingProducer struct {
	sarama.SyncProducer
	mu     sync.Mutex
	refuse func(m *sarama.ProducerMessage) error
}

func (p *refusingProducer) refusal(m *sarama.ProducerMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refuse == nil {
		return nil
	}
	return p.refuse(m)
}

func (p *refusingProducer) set(refuse func(m *sarama.ProducerMessage) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
}

func (p *refusingProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	var perrs sarama.ProducerErrors
	var rest []*sarama.ProducerMessage
	for _, m := range msgs {
		if err := p.refusal(m); err != nil {
			perrs = append(perrs, &sarama.ProducerError{Msg: m, Err: err})
			continue
		}
		rest = append(rest, m)
	}
	if len(rest) > 0 {
		if err := p.SyncProducer.SendMessages(rest); err != nil {
			var theirs sarama.ProducerErrors
			if !errors.As(err, &theirs) {
				return err
			}
			perrs = append(perrs, theirs...)
		}
	}
	if len(perrs) > 0 {
		return perrs
	}
	return nil
}

func (p *refusingProducer) SendMessage(m *sarama.ProducerMessage) (int32, int64, error) {
	if err := p.refusal(m); err != nil {
		return -1, -1, err
	}
	return p.SyncProducer.SendMessage(m)
}

func refuseKey(key string, err error) func(m *sarama.ProducerMessage) error {
	return func(m *sarama.ProducerMessage) error {
		if k, _ := m.Key.Encode(); string(k) == key {
			return err
		}
		return nil
	}
}

func refuseTopic(topic string, err error) func(m *sarama.ProducerMessage) error {
	return func(m *sarama.ProducerMessage) error {
		if m.Topic == topic {
			return err
		}
		return nil
	}
}

// testClock is a relay's clock that moves only when told.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newRefusingRelay is newRelay on a refusingProducer and a testClock, with
// a window of one minute.
func (b *testBundle) newRefusingRelay(config *RelayConfig) (*Relay, *refusingProducer, *testClock) {
	producer := &refusingProducer{SyncProducer: b.producer}
	clock := &testClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := *config
	c.Logger = slog.New(b.logs)
	c.FailingRowQuarantineAfter = time.Minute
	r := NewRelay(b.pool, producer, &c)
	r.now = clock.now
	return r, producer, clock
}

// insertRow inserts one row and returns its ID.
func insertRow(t *testing.T, b *testBundle, r Row) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`INSERT INTO outbox (topic, key, payload) VALUES ($1, $2, $3) RETURNING id`, r.Topic, r.Key, r.Payload).Scan(&id))
	return id
}

// The quarantine window of a row refused by its own fault, at its edges:
// it takes three refusals, and the window's full length, as the relay's
// clock sees it (RelayConfig.FailingRowQuarantineAfter).
func TestRelayQuarantineWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	denied := sarama.ErrTopicAuthorizationFailed

	// Each pass also delivers a row of another key on the same topic, so
	// that the topic is not refusing rows and only the row's own count
	// decides.
	t.Run("ThreeRefusalsOverExactlyTheWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
		producer.set(refuseKey("bad", denied))
		bad := insertRow(t, b, row("bad", 1))
		for pass := 1; pass <= 3; pass++ {
			if pass == 2 {
				clock.advance(time.Minute)
			}
			commit(t, b.pool, row(fmt.Sprintf("good-%d", pass), 1))
			require.NoError(t, relay.Flush(ctx), "pass %d delivered a row", pass)
			reason, published := quarantineReason(t, b.pool, bad)
			require.False(t, published)
			if pass < 3 {
				require.Empty(t, reason, "pass %d: refused %d times", pass, pass)
				continue
			}
			require.Contains(t, reason, "on 3 passes over 1m0s (topic wakes)")
			require.Contains(t, reason, denied.Error())
		}
		require.Equal(t, 1, unpublished(t, b.pool))
		// The passes that held it back said so.
		var held []string
		for _, w := range b.logs.warnings() {
			if strings.Contains(w, "rows refused") {
				held = append(held, w)
			}
		}
		require.Len(t, held, 2)
		for _, w := range held {
			require.Contains(t, w, "held=1 published=1")
		}
	})

	t.Run("ANanosecondShortOfTheWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
		producer.set(refuseKey("bad", denied))
		bad := insertRow(t, b, row("bad", 1))
		for pass := 1; pass <= 4; pass++ {
			switch pass {
			case 2:
				clock.advance(time.Minute - time.Nanosecond)
			case 4:
				clock.advance(time.Nanosecond)
			}
			commit(t, b.pool, row(fmt.Sprintf("good-%d", pass), 1))
			require.NoError(t, relay.Flush(ctx))
			reason, _ := quarantineReason(t, b.pool, bad)
			if pass < 4 {
				require.Empty(t, reason, "pass %d: the window has not passed", pass)
				continue
			}
			require.Contains(t, reason, "on 4 passes over 1m0s")
		}
	})

	// Once a topic has refused rows on three passes over the window (its
	// passes a window apart at most), a new row for it is quarantined at
	// its first refusal; a gap longer than the window ends the streak.
	t.Run("TopicStreak", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name        string
			gap         time.Duration
			quarantined bool
		}{
			{"GapOfExactlyTheWindow", time.Minute, true},
			{"GapLongerThanTheWindow", time.Minute + time.Nanosecond, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
				producer.set(refuseTopic("denied", denied))
				first := insertRow(t, b, Row{Topic: "denied", Key: "k1", Payload: []byte("1")})
				require.ErrorIs(t, relay.Flush(ctx), denied, "a pass that settles nothing")
				clock.advance(tc.gap)
				require.ErrorIs(t, relay.Flush(ctx), denied)
				// The third pass: the first row has failed three times
				// over the window; the second fails for the first time.
				second := insertRow(t, b, Row{Topic: "denied", Key: "k2", Payload: []byte("2")})
				require.NoError(t, relay.Flush(ctx))
				reason, _ := quarantineReason(t, b.pool, first)
				require.Contains(t, reason, "on 3 passes over")
				reason, _ = quarantineReason(t, b.pool, second)
				if !tc.quarantined {
					require.Empty(t, reason, "the streak began again at the second pass")
					return
				}
				require.Contains(t, reason, "topic denied has refused rows on 3 passes over 1m0s")
			})
		}
	})

	// An error that says nothing of whose fault it is (an open circuit
	// breaker) counts toward quarantining the row only while the relay
	// delivers other messages: then Kafka is up and the row is the
	// problem.
	// Sarama's breaker opens on a partition whose leader lookups failed:
	// while other partitions of its topic deliver, a fault of the
	// cluster, however long it lasts.
	t.Run("OpenBreakerWhileItsTopicDeliversNeverCounts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
		producer.set(refuseKey("bad", breaker.ErrBreakerOpen))
		bad := insertRow(t, b, row("bad", 1))
		for pass := 1; pass <= 6; pass++ {
			commit(t, b.pool, row(fmt.Sprintf("good-%d", pass), 1))
			_ = relay.Flush(ctx)
			clock.advance(time.Minute)
		}
		reason, _ := quarantineReason(t, b.pool, bad)
		require.Empty(t, reason, "a partition without a leader quarantines nothing")
		readTopic(t, b.broker.Addr(), testTopic, 6)
	})

	t.Run("UnexplainedErrorCountsOnlyWhileOthersAreDelivered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
		unexplained := errors.New("circuit breaker is open")
		producer.set(refuseKey("bad", unexplained))
		bad := insertRow(t, b, row("bad", 1))
		for pass := range 4 {
			require.ErrorIs(t, relay.Flush(ctx), unexplained, "pass %d", pass)
			clock.advance(time.Minute)
		}
		reason, _ := quarantineReason(t, b.pool, bad)
		require.Empty(t, reason, "nothing else was delivered: Kafka may be down")

		for pass := 1; pass <= 3; pass++ {
			commit(t, b.pool, row(fmt.Sprintf("good-%d", pass), 1))
			require.NoError(t, relay.Flush(ctx))
			reason, _ = quarantineReason(t, b.pool, bad)
			if pass < 3 {
				require.Empty(t, reason, "pass %d with others delivered", pass)
			}
		}
		require.Contains(t, reason, "on 3 passes over 4m0s")
		readTopic(t, b.broker.Addr(), testTopic, 3)
	})
}

// send on its own keeps a key's order: a key waiting on a refused row
// sends that row alone, whatever the pass holds (selectSQL leaves the
// later rows out already).
func TestSendHoldsTheLaterRowsOfASuspectKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay, _, _ := b.newRefusingRelay(&RelayConfig{})
	relay.suspectKeys["k"] = struct{}{}
	pass := []passRow{
		{id: 1, topic: testTopic, key: "k", payload: []byte("k/1")},
		{id: 2, topic: testTopic, key: "k", payload: []byte("k/2")},
		{id: 3, topic: testTopic, key: "j", payload: []byte("j/1")},
		{id: 4, topic: testTopic, key: "j", payload: []byte("j/2")},
	}
	marked, held, failed := relay.send(pass, map[int64]string{})
	require.Equal(t, []int64{1, 3, 4}, marked)
	require.Equal(t, 1, held)
	require.EqualError(t, failed, "an earlier row of the same key was refused")
	got := readTopic(t, b.broker.Addr(), testTopic, 3)
	require.ElementsMatch(t, []int64{1, 3, 4}, ids(got))

	// Nothing held, nothing failed.
	marked, held, failed = relay.send([]passRow{{id: 5, topic: testTopic, key: "j", payload: []byte("j/3")}}, map[int64]string{})
	require.Equal(t, []int64{5}, marked)
	require.Zero(t, held)
	require.NoError(t, failed)
}

// The broker refuses a whole produce set for size when one message in it
// is too large: the relay sends the set's rows again one by one, in ID
// order, and a key whose row fails again for another reason sends none of
// its later rows (order per key).
func TestRelayResendsASetRefusedForSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	value := func(m *sarama.ProducerMessage) string { v, _ := m.Value.Encode(); return string(v) }
	for _, tc := range []struct {
		name  string
		first string // the first row of key k
		want  []int64
	}{
		{"EveryRowGoesOutAlone", "k/1", []int64{1, 3, 4}},
		{"AKeyWhoseRowFailsAloneWaits", "k/1 flaky", []int64{4}},
		// Delivered by another produce request of the same call: its key's
		// later row, refused with the set, still goes out alone.
		{"ARowDeliveredWithTheSetHoldsNothing", "k/1 apart", []int64{1, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			producer := &setRefusingProducer{SyncProducer: b.producer, value: value}
			relay := NewRelay(b.pool, producer, &RelayConfig{Logger: slog.New(b.logs)})
			commit(t, b.pool,
				Row{Topic: testTopic, Key: "k", Payload: []byte(tc.first)}, // id 1
				Row{Topic: testTopic, Key: "j", Payload: []byte("big")},    // id 2
				row("k", 2), // id 3
				row("m", 1), // id 4
			)
			require.NoError(t, relay.Flush(ctx))
			reason, _ := quarantineReason(t, b.pool, 2)
			require.Contains(t, reason, "refused by the producer or the broker")
			got := readTopic(t, b.broker.Addr(), testTopic, len(tc.want))
			require.ElementsMatch(t, tc.want, ids(got))
			for _, r := range outboxRows(t, b.pool) {
				require.Equal(t, slices.Contains(tc.want, r.ID), r.Published, "row %d", r.ID)
			}
		})
	}
}

// setRefusingProducer refuses, as a broker does, a whole SendMessages set
// for size when a message in it is too large ("big"), except the messages
// marked "apart" (sent in a produce request of their own); sent alone, the
// big message is refused for size and a "flaky" one finds no broker.
type setRefusingProducer struct {
	sarama.SyncProducer
	value func(m *sarama.ProducerMessage) string
}

func (p *setRefusingProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	if !slices.ContainsFunc(msgs, func(m *sarama.ProducerMessage) bool { return p.value(m) == "big" }) {
		return p.SyncProducer.SendMessages(msgs)
	}
	var perrs sarama.ProducerErrors
	for _, m := range msgs {
		if !strings.HasSuffix(p.value(m), "apart") {
			perrs = append(perrs, &sarama.ProducerError{Msg: m, Err: sarama.ErrMessageSizeTooLarge})
			continue
		}
		if _, _, err := p.SyncProducer.SendMessage(m); err != nil {
			perrs = append(perrs, &sarama.ProducerError{Msg: m, Err: err})
		}
	}
	return perrs
}

func (p *setRefusingProducer) SendMessage(m *sarama.ProducerMessage) (int32, int64, error) {
	switch v := p.value(m); {
	case v == "big":
		return -1, -1, sarama.ErrMessageSizeTooLarge
	case strings.HasSuffix(v, "flaky"):
		return -1, -1, sarama.ErrOutOfBrokers
	}
	return p.SyncProducer.SendMessage(m)
}

// A pass that settles nothing backs off 100ms, then twice as long each
// time (at most 5s).
func TestRelayBacksOffExponentially(t *testing.T) {
	t.Parallel()
	b := setup(t)
	relay, producer, _ := b.newRefusingRelay(&RelayConfig{PollInterval: time.Hour})
	producer.set(refuseKey("k", sarama.ErrOutOfBrokers))
	commit(t, b.pool, row("k", 1))
	require.NoError(t, relay.Start(context.Background()))
	defer relay.Stop()
	failures := func() []string {
		var out []string
		for _, w := range b.logs.warnings() {
			if strings.Contains(w, "publish failed") {
				out = append(out, w)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(failures()) >= 4 }, waitFor, 10*time.Millisecond)
	for i, wait := range []string{"100ms", "200ms", "400ms", "800ms"} {
		w := failures()[i]
		require.Contains(t, w, "retry_in="+wait, "failure %d", i+1)
		require.Contains(t, w, fmt.Sprintf("failures=%d", i+1))
	}
	producer.set(nil)
	require.Eventually(t, func() bool { return unpublished(t, b.pool) == 0 }, waitFor, 10*time.Millisecond)
}

// Flush goes on while passes come back full: everything committed before
// it was called is published, however many batches that takes.
func TestFlushPublishesFullBatchesToTheEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var batches []int
	relay := b.newRelay(&RelayConfig{BatchSize: 2, OnPublished: func(n int, _ time.Duration) { batches = append(batches, n) }})
	commit(t, b.pool, row("k", 1), row("k", 2), row("j", 1), row("j", 2))
	require.NoError(t, relay.Flush(context.Background()))
	require.Zero(t, unpublished(t, b.pool))
	require.Equal(t, []int{2, 2}, batches, "two full batches, then an empty pass")
	readTopic(t, b.broker.Addr(), testTopic, 4)
}

// The relay's estimate of a message's size (payload, key, the outbox ID
// header and 64 bytes of framing) against RelayConfig.MaxMessageBytes: a
// row at the limit goes out, one byte more is quarantined. OnPublished is
// called for delivered rows only.
func TestRelayMessageSizeLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 1024
	var published []int
	relay := b.newRelay(&RelayConfig{MaxMessageBytes: limit, OnPublished: func(n int, _ time.Duration) { published = append(published, n) }})
	sized := func(key string, size int) Row {
		return Row{Topic: testTopic, Key: key, Payload: make([]byte, size-len(key)-len(HeaderOutboxID)-64)}
	}
	over := insertRow(t, b, sized("over-the-limit", limit+1))
	require.NoError(t, relay.Flush(context.Background()))
	reason, _ := quarantineReason(t, b.pool, over)
	require.Equal(t, "message of about 1025 bytes exceeds the producer's limit of 1024", reason)
	require.Empty(t, published, "a pass that only quarantined published nothing")

	at := insertRow(t, b, sized("at-the-limit", limit))
	require.NoError(t, relay.Flush(context.Background()))
	reason, published2 := quarantineReason(t, b.pool, at)
	require.Empty(t, reason)
	require.True(t, published2)
	require.Equal(t, []int{1}, published)
	readTopic(t, b.broker.Addr(), testTopic, 1)
}

// Insert writes nothing for no rows and keeps the rows' order; Columns,
// the arguments of the SQL functions that insert rows in a call, keeps it
// too.
func TestInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rows := []Row{row("k", 1), row("j", 1), row("k", 2)}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := Insert(ctx, tx); err != nil {
			return err
		}
		return Insert(ctx, tx, rows...)
	}))
	require.Equal(t, []dbRow{{ID: 1, Key: "k"}, {ID: 2, Key: "j"}, {ID: 3, Key: "k"}}, outboxRows(t, b.pool))
	topics, keys, payloads := Columns(rows)
	require.Equal(t, []string{testTopic, testTopic, testTopic}, topics)
	require.Equal(t, []string{"k", "j", "k"}, keys)
	require.Equal(t, [][]byte{rows[0].Payload, rows[1].Payload, rows[2].Payload}, payloads)
}

// The documented defaults of RelayConfig.
func TestRelayDefaults(t *testing.T) {
	t.Parallel()
	r := NewRelay(nil, nil, nil)
	require.Equal(t, 500, r.config.BatchSize)
	require.Equal(t, 50*time.Millisecond, r.config.PollInterval)
	require.Equal(t, 2*time.Minute, r.config.FailingRowQuarantineAfter)
	require.Equal(t, 1_000_000, r.maxMessageBytes())
}

// A row the broker refused for size with its set is quarantined only once
// it is refused alone, even when the row before it in its key (which kept
// it from being sent alone) is quarantined in the same pass.
func TestRelaySizeRefusalBehindARowQuarantinedInThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	relay, producer, clock := b.newRefusingRelay(&RelayConfig{})
	denied := sarama.ErrTopicAuthorizationFailed
	producer.set(func(m *sarama.ProducerMessage) error {
		if m.Topic == "denied" {
			return denied
		}
		if v, _ := m.Value.Encode(); strings.HasPrefix(string(v), "big") {
			return sarama.ErrMessageSizeTooLarge
		}
		return nil
	})
	// The topic refuses rows for a whole window: its next row is
	// quarantined at its first refusal.
	first := insertRow(t, b, Row{Topic: "denied", Key: "x", Payload: []byte("x")})
	require.Error(t, relay.Flush(ctx))
	clock.advance(time.Minute)
	require.Error(t, relay.Flush(ctx))
	require.NoError(t, relay.Flush(ctx))
	reason, _ := quarantineReason(t, b.pool, first)
	require.Contains(t, reason, "on 3 passes over 1m0s")

	commit(t, b.pool,
		Row{Topic: "denied", Key: "s", Payload: []byte("s/1")},      // id 2
		Row{Topic: testTopic, Key: "s", Payload: []byte("big s/2")}, // id 3
		Row{Topic: testTopic, Key: "c", Payload: []byte("big c/1")}, // id 4
		row("d", 1), // id 5
	)
	require.NoError(t, relay.Flush(ctx))
	reason, _ = quarantineReason(t, b.pool, 2)
	require.Contains(t, reason, "topic denied has refused rows on 4 passes")
	reason, published := quarantineReason(t, b.pool, 3)
	require.False(t, published)
	require.Empty(t, reason, "refused with its set only: not yet known to be too large")
	reason, _ = quarantineReason(t, b.pool, 4)
	require.Equal(t, "refused by the producer or the broker: "+sarama.ErrMessageSizeTooLarge.Error(), reason)
	_, published = quarantineReason(t, b.pool, 5)
	require.True(t, published)
	var held []string
	for _, w := range b.logs.warnings() {
		if strings.Contains(w, "rows refused") {
			held = append(held, w)
		}
	}
	require.Len(t, held, 1)
	require.Contains(t, held[0], "held=1 published=1")

	// Alone, it is refused for size again: now it is set aside.
	require.NoError(t, relay.Flush(ctx))
	reason, _ = quarantineReason(t, b.pool, 3)
	require.Equal(t, "refused by the producer or the broker: "+sarama.ErrMessageSizeTooLarge.Error(), reason)
	readTopic(t, b.broker.Addr(), testTopic, 1)
}

// refuseKeyPrefix refuses the messages whose key starts with prefix.
func refuseKeyPrefix(prefix string, err error) func(m *sarama.ProducerMessage) error {
	return func(m *sarama.ProducerMessage) error {
		if k, _ := m.Key.Encode(); strings.HasPrefix(string(k), prefix) {
			return err
		}
		return nil
	}
}

// Rows Kafka keeps refusing for a cluster's reason (a partition without a
// leader) are the oldest unpublished rows, so they come first in every
// pass. When they alone reach MaxPassBytes, a pass must still carry the
// other keys' rows: a relay that retried only them would publish nothing
// for any session for as long as that partition is down.
func TestFailingRowsDoNotFillEveryPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	relay, producer, clock := b.newRefusingRelay(&RelayConfig{MaxPassBytes: 1000})
	producer.set(refuseKeyPrefix("bad-", sarama.ErrLeaderNotAvailable))
	for i := range 5 {
		insertRow(t, b, Row{Topic: testTopic, Key: fmt.Sprintf("bad-%d", i), Payload: bytes.Repeat([]byte("x"), 300)})
	}
	var good []int64
	for i := range 20 {
		good = append(good, insertRow(t, b, row(fmt.Sprintf("good-%d", i), 1)))
	}
	for range 10 {
		_ = relay.Flush(ctx)
		clock.advance(time.Minute)
	}
	for _, id := range good {
		_, published := quarantineReason(t, b.pool, id)
		require.True(t, published, "row %d of a healthy key", id)
	}
	for i := range 5 {
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE key = $1 AND (published_at IS NOT NULL OR quarantine_reason IS NOT NULL)`, fmt.Sprintf("bad-%d", i)),
			"a transient refusal publishes and quarantines nothing")
	}

	// Each refused row is still tried again, none left behind for good.
	tried := map[string]int{}
	producer.set(func(m *sarama.ProducerMessage) error {
		k, _ := m.Key.Encode()
		tried[string(k)]++
		return refuseKeyPrefix("bad-", sarama.ErrLeaderNotAvailable)(m)
	})
	for range 6 {
		_ = relay.Flush(ctx)
	}
	t.Logf("tried %v", tried)
	for i := range 5 {
		require.Positive(t, tried[fmt.Sprintf("bad-%d", i)], "bad-%d is retried", i)
	}
}

// What a relay remembers of a failing row must not outlive the row: a row
// published by another relay (or process) leaves this one's memory at its
// next pass, even when that pass finds nothing else to send, or the row's
// key, left out as waiting on it, would never be selected again.
func TestForgetsARowPublishedElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	relay, producer, _ := b.newRefusingRelay(&RelayConfig{})
	producer.set(refuseKey("k", sarama.ErrLeaderNotAvailable))
	first := insertRow(t, b, row("k", 1))
	require.Error(t, relay.Flush(ctx))

	// Another relay publishes it.
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = $1`, first)
	require.NoError(t, err)
	producer.set(nil)
	require.NoError(t, relay.Flush(ctx), "an empty pass")
	second := insertRow(t, b, row("k", 2))
	require.NoError(t, relay.Flush(ctx))
	_, published := quarantineReason(t, b.pool, second)
	require.True(t, published, "the key's next row is published")
}
