//go:build apachekafka

package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// The tests of this build tag (apachekafka) always run against Apache
// Kafka, started by themselves through testkit.StartApacheKafka: they kill,
// pause and restart its nodes, which the embedded broker has not got.
//
//	go test -tags apachekafka -count=1 -timeout 30m -run 'TestApache' ./cmd/consumer

// apacheSetup is setup on an Apache Kafka cluster of nodes: the consumers
// get every node's address, the test's clients too.
func apacheSetup(t *testing.T, nodes int) (*testBundle, *testkit.ApacheKafka) {
	t.Helper()
	k := testkit.StartApacheKafka(t, nodes)
	pool, dbURL := testkit.Pool(t)
	b := &testBundle{addr: strings.Join(k.Addrs(), ","), dbURL: dbURL, group: "test-" + uuid.NewString(), pool: pool}
	return b, k
}

// connectClients makes the bundle's producer and events reader; the
// topics must exist (the first consumer creates them).
func (b *testBundle) connectClients(t *testing.T, k *testkit.ApacheKafka) *stampedReader {
	t.Helper()
	p, err := sarama.NewSyncProducer(k.Addrs(), kafkautil.NewConfig("test-producer"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	b.producer = p
	r := readTopicStamped(t, k.Addrs(), "session-events")
	b.events = &r.topicReader
	return r
}

// stampedReader is a topicReader of a cluster whose arrivals (when each
// record arrived here) the test reads.
type stampedReader struct {
	topicReader
}

func readTopicStamped(t *testing.T, addrs []string, topic string) *stampedReader {
	t.Helper()
	return &stampedReader{topicReader{testkit.ReadTopic(t, addrs, topic, &testkit.TopicReaderOpts{Config: kafkautil.NewConfig("test-reader")})}}
}

// arrivals returns the arrival times of the records so far.
func (r *stampedReader) arrivals() []time.Time { return r.Arrivals() }

// sent is a prompt the broker acknowledged (acks=all).
type sent struct {
	p         envelope.Prompt
	partition int32
	acked     time.Time
}

// loadGen sends prompts to sessions, each session its own sender (one
// prompt every interval×sessions), until stopped: a send held by one
// partition's leader holds only that session's prompts. A send that fails
// (a leader moving, not enough replicas) is retried with the same
// envelope until the broker acknowledges it, as a careful producer does:
// the message ID makes a duplicate record harmless.
type loadGen struct {
	mu   sync.Mutex
	sent []sent
	errs int
	stop chan struct{}
	wg   sync.WaitGroup
}

func startLoad(t *testing.T, producer sarama.SyncProducer, prefix string, sessions int, interval time.Duration) *loadGen {
	t.Helper()
	g := &loadGen{stop: make(chan struct{})}
	for s := range sessions {
		g.wg.Go(func() { g.send(producer, fmt.Sprintf("%s-%d", prefix, s), interval*time.Duration(sessions)) })
	}
	t.Cleanup(g.halt)
	return g
}

func (g *loadGen) send(producer sarama.SyncProducer, session string, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
		p := prompt(session, fmt.Sprintf("prompt %d", i))
		v, err := envelope.Marshal(p)
		if err != nil {
			panic(err)
		}
		for {
			part, _, err := producer.SendMessage(&sarama.ProducerMessage{
				Topic: "prompts", Key: sarama.StringEncoder(p.SessionID), Value: sarama.ByteEncoder(v),
			})
			if err == nil {
				g.mu.Lock()
				g.sent = append(g.sent, sent{p: p, partition: part, acked: time.Now()})
				g.mu.Unlock()
				break
			}
			g.mu.Lock()
			g.errs++
			g.mu.Unlock()
			select {
			case <-g.stop:
				// Unacknowledged: it may or may not be in the log; the
				// promises cover acknowledged prompts.
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

func (g *loadGen) halt() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	g.wg.Wait()
}

func (g *loadGen) snapshot() ([]sent, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]sent(nil), g.sent...), g.errs
}

// waitSent waits until n more prompts than now have been acknowledged.
func (g *loadGen) waitSent(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	s, _ := g.snapshot()
	start := len(s)
	require.Eventually(t, func() bool { s, _ := g.snapshot(); return len(s) >= start+n },
		timeout, 50*time.Millisecond, "%d more prompts acknowledged", n)
}

// admissionsSince returns the admission times, by the database clock
// (the same host's clock as this process's), of the inputs of partitions
// (all if nil) admitted after since.
func (b *testBundle) admissionsSince(t *testing.T, partitions []int32, since time.Time) []time.Time {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `
SELECT admitted_at FROM inputs
WHERE admitted_at > $1 AND source_topic = 'prompts' AND ($2::int[] IS NULL OR source_partition = ANY($2))
ORDER BY admitted_at`, since, partitions)
	require.NoError(t, err)
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var at time.Time
		require.NoError(t, rows.Scan(&at))
		out = append(out, at)
	}
	require.NoError(t, rows.Err())
	return out
}

// longestGap is the longest time without an entry of times (sorted) in
// [from, until]: from counts as an entry, so an empty window is one gap.
func longestGap(times []time.Time, from, until time.Time) time.Duration {
	var gap time.Duration
	last := from
	for _, at := range times {
		if at.Before(from) || at.After(until) {
			continue
		}
		gap = max(gap, at.Sub(last))
		last = at
	}
	return gap
}

// firstAfter is the time from since to the first entry of times after it;
// -1 if none.
func firstAfter(times []time.Time, since time.Time) time.Duration {
	for _, at := range times {
		if at.After(since) {
			return at.Sub(since)
		}
	}
	return -1
}

// readySampler polls a consumer's /readyz and its promptline_ready
// gauge, noting every change.
type readySampler struct {
	mu      sync.Mutex
	changes []readyChange
	stop    chan struct{}
	done    chan struct{}
}

type readyChange struct {
	at     time.Time
	readyz int     // HTTP status, 0: no answer
	gauge  float64 // promptline_ready, -1: no answer
}

func sampleReady(t *testing.T, metricsAddr string) *readySampler {
	t.Helper()
	s := &readySampler{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 2 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get("http://" + metricsAddr + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, sb.String()
	}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			code, _ := get("/readyz")
			gauge := -1.0
			if c, body := get("/metrics"); c == http.StatusOK {
				for l := range strings.Lines(body) {
					if v, ok := strings.CutPrefix(strings.TrimSpace(l), "promptline_ready "); ok {
						_, _ = fmt.Sscan(v, &gauge)
					}
				}
			}
			s.mu.Lock()
			if n := len(s.changes); n == 0 || s.changes[n-1].readyz != code || s.changes[n-1].gauge != gauge {
				s.changes = append(s.changes, readyChange{at: time.Now(), readyz: code, gauge: gauge})
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

func (s *readySampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// notReadyWithin reports whether /readyz said not ready (or the gauge 0)
// at some point in [from, until], and for how long in all.
func (s *readySampler) notReadyWithin(from, until time.Time) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var total time.Duration
	seen := false
	for i, c := range s.changes {
		end := until
		if i+1 < len(s.changes) {
			end = s.changes[i+1].at
		}
		if end.Before(from) || c.at.After(until) {
			continue
		}
		if c.readyz != http.StatusOK || c.gauge == 0 {
			seen = true
			if end.After(until) {
				end = until
			}
			total += end.Sub(maxTime(c.at, from))
		}
	}
	return seen, total
}

func (s *readySampler) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sb strings.Builder
	for _, c := range s.changes {
		fmt.Fprintf(&sb, "%s readyz=%d promptline_ready=%v\n", c.at.Format("15:04:05.000"), c.readyz, c.gauge)
	}
	return sb.String()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// requireSingleWriter checks the promises over every acknowledged prompt:
// admitted once, answered by one turn event (by ID) and one assistant
// message; and every outbox row published, every session event in the
// topic.
func (b *testBundle) requireSingleWriter(t *testing.T, r *stampedReader, all []sent) (completed, reconciled int) {
	t.Helper()
	for _, s := range all {
		b.events.waitTurnWithin(t, s.p.MessageID, 5*time.Minute)
	}
	for _, s := range all {
		id := s.p.MessageID
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = $1`, id), "one input for %s", id)
		turns := b.events.turnEvents(t, id)
		require.Equal(t, 1, distinctIDs(turns), "one turn for %s: %v", id, turns)
		require.Equal(t, 1, b.count(t, assistantAnswering, id), "one answer to %s", id)
		if turns[0].Type == envelope.EventTurnCompleted {
			completed++
		} else {
			require.Equal(t, envelope.FailOutcomeUnknown, turns[0].Reason, "a failed turn can only be a reconciled one")
			reconciled++
		}
	}
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, 2*time.Minute, 100*time.Millisecond, "every outbox row (events, wakes) published")
	want := b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'session-events'`)
	require.Eventually(t, func() bool { return distinctIDs(b.events.events(t)) >= want },
		time.Minute, 100*time.Millisecond, "every session event of the outbox in session-events")
	return completed, reconciled
}

// waitTurnWithin is waitTurn with a deadline of the caller's.
func (r *topicReader) waitTurnWithin(t *testing.T, msgID string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return len(r.turnEvents(t, msgID)) > 0 },
		timeout, 50*time.Millisecond, "no turn event for %s", msgID)
}

// notReadyNow reports whether the last sample said not ready.
func (s *readySampler) notReadyNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.changes)
	return n == 0 || s.changes[n-1].readyz != http.StatusOK || s.changes[n-1].gauge != 1
}
