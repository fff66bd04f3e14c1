package eventsconsumer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

const (
	maxRetries = 3
	partitions = 4
	topic      = "session-events"
	group      = "example-watermill"
)

// record is what the test publishes: a session event, or raw bytes that
// are not one.
type record struct {
	session string
	event   *envelope.Event
	raw     string
}

func event(session, typ, id string) record {
	return record{session: session, event: &envelope.Event{ID: id, Type: typ, SessionID: session, At: time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)}}
}

// testBundle is one embedded broker with a producer on it.
type testBundle struct {
	addr     string
	producer sarama.SyncProducer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	addr := testkit.Broker(t, partitions).Addr()
	producer, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("example-watermill-producer"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, producer.Close()) })
	return &testBundle{addr: addr, producer: producer}
}

// publish sends the records one by one, in order, keyed by session as the
// outbox relay keys them; it returns the partition of each session.
func (b *testBundle) publish(t *testing.T, records []record) map[string]int32 {
	t.Helper()
	where := map[string]int32{}
	for _, r := range records {
		value := []byte(r.raw)
		if r.event != nil {
			var err error
			value, err = json.Marshal(r.event)
			require.NoError(t, err)
		}
		p, _, err := b.producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(r.session), Value: sarama.ByteEncoder(value)})
		require.NoError(t, err)
		where[r.session] = p
	}
	return where
}

// TestEventsRouter runs the router against the embedded broker on events
// published as the relay publishes them: at least once (repeats of an id,
// among them the tail a relay republishes after a crash), in order per
// session, interleaved across sessions, plus a value that is no event.
func TestEventsRouter(t *testing.T) {
	t.Parallel()

	t.Run("HandlesEachEventOnceInSessionOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Two sessions on two partitions (murmur2, 4 partitions), so that
		// the partitions are consumed concurrently.
		const s1, s2 = "sess-1", "sess-2"
		where := b.publish(t, []record{
			event(s2, envelope.EventInputAdmitted, "adm-2a"),
			event(s1, envelope.EventInputAdmitted, "adm-1a"),
			event(s1, envelope.EventTurnCompleted, "turn-1a"), // fails once
			event(s2, envelope.EventTurnCompleted, "turn-2a"), // panics once
			event(s1, envelope.EventTurnCompleted, "turn-1a"), // repeat
			{session: s2, raw: "not a session event"},
			event(s1, envelope.EventInputAdmitted, "adm-1b"),
			event(s1, envelope.EventTurnFailed, "turn-1b"), // fails one whole delivery
			event(s2, envelope.EventTurnFailed, "turn-2b"),
			event(s1, envelope.EventInputAdmitted, "adm-1b"),  // the republished tail
			event(s1, envelope.EventTurnFailed, "turn-1b"),    // the republished tail
			event(s2, envelope.EventTurnCompleted, "turn-2a"), // a late repeat
			event(s1, envelope.EventTurnCompleted, "turn-1c"), // last of s1
			event(s2, envelope.EventTurnCompleted, "turn-2c"), // last of s2
		})
		require.NotEqual(t, where[s1], where[s2], "the sessions must be on two partitions")

		var (
			mu        sync.Mutex
			attempts  = map[string]int{}
			handled   = map[string][]string{} // session → event ids, in handling order
			wrongKeys []string
			last      = make(chan string, 4) // the last event of each session
		)
		handle := func(ctx context.Context, e envelope.Event) error {
			mu.Lock()
			attempts[e.ID]++
			n := attempts[e.ID]
			if key, _ := kafka.MessageKeyFromCtx(ctx); string(key) != e.SessionID {
				wrongKeys = append(wrongKeys, e.ID)
			}
			mu.Unlock()
			switch {
			case e.ID == "turn-1a" && n == 1:
				return errors.New("the downstream service is briefly unavailable")
			case e.ID == "turn-2a" && n == 1:
				panic("a bug that a retry gets past")
			case e.ID == "turn-1b" && n <= maxRetries+1:
				return errors.New("the downstream service is down for a while")
			}
			mu.Lock()
			handled[e.SessionID] = append(handled[e.SessionID], e.ID)
			mu.Unlock()
			if e.ID == "turn-1c" || e.ID == "turn-2c" {
				last <- e.ID
			}
			return nil
		}

		logs := &logBuffer{}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("router logs:\n%s", logs)
			}
		})
		logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		router, err := NewEventsRouter(handle, logger, &Config{
			Brokers:       []string{b.addr},
			Group:         group,
			Types:         []string{envelope.EventTurnCompleted, envelope.EventTurnFailed},
			MaxRetries:    maxRetries,
			RetryInterval: 10 * time.Millisecond,
			CloseTimeout:  10 * time.Second,
		})
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- router.Run(ctx) }()
		closed := false
		closeRouter := func() {
			if closed {
				return
			}
			closed = true
			require.NoError(t, router.Close())
			select {
			case err := <-ran:
				require.NoError(t, err)
			case <-ctx.Done():
				t.Fatal("Router.Run did not return after Close")
			}
		}
		defer closeRouter()

		// The last event of a session is handled only after every
		// earlier message of its partition: a partition is consumed one
		// message at a time.
		for range 2 {
			select {
			case <-last:
			case <-ctx.Done():
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("timed out; handled so far: %v", handled)
			}
		}

		// Acknowledged means committed: the group's offsets reach the end
		// of both partitions, past the value that is no event (polled: the
		// commit runs on Sarama's auto-commit interval).
		admin, err := sarama.NewClusterAdmin([]string{b.addr}, kafkautil.NewConfig("example-watermill-admin"))
		require.NoError(t, err)
		defer admin.Close()
		client, err := sarama.NewClient([]string{b.addr}, kafkautil.NewConfig("example-watermill-offsets"))
		require.NoError(t, err)
		defer client.Close()
		want := map[int32]int64{}
		for _, p := range []int32{where[s1], where[s2]} {
			want[p], err = client.GetOffset(topic, p, sarama.OffsetNewest)
			require.NoError(t, err)
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for committed := map[int32]int64{}; ; {
			resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {where[s1], where[s2]}})
			require.NoError(t, err)
			for p := range want {
				if blk := resp.GetBlock(topic, p); blk != nil {
					committed[p] = blk.Offset
				}
			}
			if len(committed) == len(want) && committed[where[s1]] == want[where[s1]] && committed[where[s2]] == want[where[s2]] {
				break
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatalf("committed offsets %v, want %v", committed, want)
			}
		}

		closeRouter()

		// Router.Close waited for running handlers: nothing changes now.
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"turn-1a", "turn-1b", "turn-1c"}, handled[s1], "each id of %s once, in order", s1)
		require.Equal(t, []string{"turn-2a", "turn-2b", "turn-2c"}, handled[s2], "each id of %s once, in order", s2)
		require.Len(t, handled, 2)
		require.Equal(t, map[string]int{
			"turn-1a": 2,              // failed, then retried by the Retry middleware
			"turn-2a": 2,              // panicked, recovered, then retried
			"turn-1b": maxRetries + 2, // a delivery of 1+maxRetries attempts, nacked, delivered again
			"turn-1c": 1, "turn-2b": 1, "turn-2c": 1,
		}, attempts, "handle is never called for a repeat or a type outside Config.Types")
		require.Empty(t, wrongKeys, "the Kafka key (from the message context) is the session")

		// What the middleware did, as the router logged it.
		var retried, routerErrors, routerPanics, skipped []string
		for _, r := range logs.records(t) {
			switch r.Msg {
			case "Error occurred, retrying": // Retry
				retried = append(retried, r.Error)
			case "Handler returned error": // the router, before it nacks
				routerErrors = append(routerErrors, r.Error)
			case "Panic recovered in handler": // the router's last resort
				routerPanics = append(routerPanics, r.Error)
			case "skipping a message that is not a session event":
				skipped = append(skipped, r.Error)
			}
		}
		require.True(t, containsString(retried, "turn-1a"), "Retry retried the failed handle: %q", retried)
		require.True(t, containsString(retried, "a bug that a retry gets past"), "Recoverer turned the panic into an error that Retry retried: %q", retried)
		require.Empty(t, routerPanics, "no panic reached the router")
		require.Len(t, routerErrors, 1, "only turn-1b outlasted its retries: %q", routerErrors)
		require.Contains(t, routerErrors[0], "turn-1b")
		require.Len(t, skipped, 1, "the value that is no event was skipped once")
	})

	t.Run("StopsWhenTheContextEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.publish(t, []record{event("sess-1", envelope.EventTurnCompleted, "turn-1a")})
		handled := make(chan string, 1)
		router, err := NewEventsRouter(func(_ context.Context, e envelope.Event) error {
			handled <- e.ID
			return nil
		}, slog.New(slog.DiscardHandler), &Config{Brokers: []string{b.addr}, Group: group})
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ran := make(chan error, 1)
		go func() { ran <- router.Run(ctx) }()
		deadline := time.NewTimer(60 * time.Second)
		defer deadline.Stop()
		select {
		case id := <-handled:
			require.Equal(t, "turn-1a", id)
		case <-deadline.C:
			t.Fatal("no event handled")
		}
		cancel()
		select {
		case err := <-ran:
			require.NoError(t, err)
		case <-deadline.C:
			t.Fatal("Router.Run did not return after its context ended")
		}
		require.True(t, router.IsClosed())
	})

	t.Run("RequiresBrokersAndGroup", func(t *testing.T) {
		t.Parallel()
		nop := func(context.Context, envelope.Event) error { return nil }
		_, err := NewEventsRouter(nop, nil, &Config{Group: group})
		require.ErrorContains(t, err, "Brokers is required")
		_, err = NewEventsRouter(nop, nil, &Config{Brokers: []string{"127.0.0.1:9092"}})
		require.ErrorContains(t, err, "Group is required")
		_, err = NewEventsRouter(nil, nil, &Config{Brokers: []string{"127.0.0.1:9092"}, Group: group})
		require.ErrorContains(t, err, "handle is nil")
	})
}

func TestSeenIDs(t *testing.T) {
	t.Parallel()

	t.Run("ForgetsTheLeastRecentlyUsed", func(t *testing.T) {
		t.Parallel()
		s := newSeenIDs(2)
		s.add("a")
		s.add("b")
		require.True(t, s.contains("a")) // a is now more recent than b
		s.add("c")                       // full: b goes
		require.True(t, s.contains("a"))
		require.False(t, s.contains("b"))
		require.True(t, s.contains("c"))
	})

	t.Run("AddingTwiceKeepsOne", func(t *testing.T) {
		t.Parallel()
		s := newSeenIDs(2)
		s.add("a")
		s.add("a")
		s.add("b")
		require.True(t, s.contains("a"))
		require.True(t, s.contains("b"))
		require.Equal(t, 2, s.order.Len())
	})
}

// logBuffer collects the router's JSON log lines. It is not the test's
// output: watermill-kafka closes its Kafka client in a goroutine of its
// own, which may log a moment after Router.Close returned.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type logRecord struct {
	Msg   string `json:"msg"`
	Error string `json:"error"`
}

func (l *logBuffer) records(t *testing.T) []logRecord {
	t.Helper()
	var out []logRecord
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(nil, 1<<20) // a recovered panic logs its stack on one line
	for sc.Scan() {
		var r logRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "log line %s", sc.Bytes())
		out = append(out, r)
	}
	require.NoError(t, sc.Err())
	return out
}

func containsString(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
