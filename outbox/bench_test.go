package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// These benchmarks decide how the relay learns of new rows: polling (plus
// the in-process Nudge) or LISTEN/NOTIFY. They run on the real Postgres and
// the embedded broker; docs/benchmarks.md records a run and the decision.
//
//	go test -run '^$' -bench . -count 3 ./outbox

// notifyTriggerSQL is what LISTEN/NOTIFY would need in the schema. It is
// installed only in the benchmark's own databases.
const notifyTriggerSQL = `
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();`

const (
	benchWriters = 16
	// benchRound is the number of commits in one round of
	// BenchmarkOutboxCommit; rounds alternate between the two databases.
	benchRound = 250
	// benchArrivalMean is the mean gap between inserts in
	// BenchmarkCommitToPublish (Poisson arrivals, about 200 rows/s).
	benchArrivalMean = 5 * time.Millisecond
)

// BenchmarkOutboxCommit measures the commit throughput of outbox inserts
// (one row per transaction) from 16 concurrent writers, on a database
// without and one with a statement-level NOTIFY trigger (a relay LISTENs
// there and drains the notifications). Rounds alternate between the two so
// that both see the same machine noise; it reports each rate and their
// ratio.
func BenchmarkOutboxCommit(b *testing.B) {
	ctx := context.Background()
	plain := benchPool(b, benchWriters)
	notify := benchPool(b, benchWriters)
	_, err := notify.Exec(ctx, notifyTriggerSQL)
	if err != nil {
		b.Fatal(err)
	}
	var heard atomic.Int64
	stopListening := listen(b, notify, func() { heard.Add(1) })
	defer stopListening()

	var spent [2]time.Duration
	var done [2]int
	pools := [2]*pgxpool.Pool{plain, notify}
	b.ResetTimer()
	for i := 0; done[0]+done[1] < b.N; i++ {
		which := i % 2
		n := min(benchRound, b.N-done[0]-done[1])
		start := time.Now()
		if err := commitConcurrently(ctx, pools[which], benchWriters, n); err != nil {
			b.Fatal(err)
		}
		spent[which] += time.Since(start)
		done[which] += n
	}
	b.StopTimer()
	if done[1] == 0 {
		return // b.N == 1: the probe run
	}
	plainRate := float64(done[0]) / spent[0].Seconds()
	notifyRate := float64(done[1]) / spent[1].Seconds()
	b.ReportMetric(plainRate, "plain-commits/s")
	b.ReportMetric(notifyRate, "notify-commits/s")
	b.ReportMetric(notifyRate/plainRate, "notify/plain")
	b.ReportMetric(float64(heard.Load()), "notifications")
}

// commitConcurrently commits n one-row outbox transactions from writers
// goroutines.
func commitConcurrently(ctx context.Context, pool *pgxpool.Pool, writers, n int) error {
	var next atomic.Int64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				r := Row{Topic: "wakes", Key: fmt.Sprintf("s-%d", i%97), Payload: []byte("wake")}
				if err := commitRows(ctx, pool, r); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// BenchmarkCommitToPublish measures the time from an insert's commit to
// the relay's SendMessages returning for that row, with rows arriving at
// random (Poisson, about 200/s) from one writer. Variants: polling without
// nudges (the cross-process case) at three intervals; a LISTEN-driven loop
// (a NOTIFY trigger, a listening connection that nudges the relay); and
// the in-process Nudge. The two push variants poll only hourly.
func BenchmarkCommitToPublish(b *testing.B) {
	variants := []struct {
		name   string
		poll   time.Duration
		listen bool
		nudge  bool
		rival  bool // a second relay (another process's) on the same outbox, nudged by its own writer
	}{
		{name: "poll=5ms", poll: 5 * time.Millisecond},
		{name: "poll=20ms", poll: 20 * time.Millisecond},
		{name: "poll=50ms", poll: 50 * time.Millisecond},
		{name: "poll=100ms", poll: 100 * time.Millisecond},
		{name: "listen", poll: time.Hour, listen: true},
		{name: "nudge", poll: time.Hour, nudge: true},
		{name: "nudge+rival", poll: pollIntervalDefault, nudge: true, rival: true},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b, 4)
			broker := testkit.Broker(b, 4)
			producer, err := sarama.NewSyncProducer([]string{broker.Addr()}, kafkautil.NewConfig("outbox-bench"))
			if err != nil {
				b.Fatal(err)
			}
			defer producer.Close()
			timed := &timedProducer{SyncProducer: producer, sent: make(chan struct{}, 1)}
			relay := NewRelay(pool, timed, &RelayConfig{PollInterval: v.poll})
			if v.listen {
				if _, err := pool.Exec(ctx, notifyTriggerSQL); err != nil {
					b.Fatal(err)
				}
				defer listen(b, pool, relay.Nudge)()
			}
			if err := relay.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer relay.Stop()
			if v.rival {
				defer runRival(b, pool, timed, v.poll)()
			}

			var committed []time.Time
			commit := func() {
				seq := len(committed)
				r := Row{Topic: "wakes", Key: fmt.Sprintf("s-%d", seq%97), Payload: strconv.AppendInt(nil, int64(seq), 10)}
				if err := commitRows(ctx, pool, r); err != nil {
					b.Fatal(err)
				}
				committed = append(committed, time.Now())
				if v.nudge {
					relay.Nudge()
				}
			}
			// Warm up connections and producer metadata; not counted.
			commit()
			timed.waitFor(b, 1)
			committed = committed[:0]
			timed.reset()

			next := time.Now()
			timer := time.NewTimer(0)
			defer timer.Stop()
			for b.Loop() {
				// Open loop, but a writer that fell behind (the machine
				// stalled) starts afresh instead of committing a burst.
				if late := time.Now().Add(-benchArrivalMean); next.Before(late) {
					next = late
				}
				next = next.Add(time.Duration(rand.ExpFloat64() * float64(benchArrivalMean)))
				timer.Reset(time.Until(next))
				<-timer.C
				commit()
			}
			published := timed.waitFor(b, len(committed))

			latencies := make([]time.Duration, len(committed))
			for i, c := range committed {
				latencies[i] = max(0, published[i].Sub(c))
			}
			slices.Sort(latencies)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			var sum time.Duration
			for _, l := range latencies {
				sum += l
			}
			b.ReportMetric(ms(latencies[len(latencies)/2]), "p50-ms")
			b.ReportMetric(ms(latencies[len(latencies)*99/100]), "p99-ms")
			b.ReportMetric(ms(sum/time.Duration(len(latencies))), "mean-ms")
			b.ReportMetric(float64(len(latencies)), "rows")
		})
	}
}

// runRival runs another process's relay on pool, publishing through the
// same timed producer (a row is timed by whichever relay sends it first),
// and its own writer, committing rows (payload -1, not timed) at the
// benchmark's rate and nudging it. It returns the function that stops both.
func runRival(b *testing.B, pool *pgxpool.Pool, timed *timedProducer, poll time.Duration) func() {
	ctx, cancel := context.WithCancel(context.Background())
	rival := NewRelay(pool, timed, &RelayConfig{PollInterval: poll})
	if err := rival.Start(ctx); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(rand.ExpFloat64() * float64(benchArrivalMean))):
			}
			if err := commitRows(ctx, pool, Row{Topic: "wakes", Key: "rival", Payload: []byte("-1")}); err != nil {
				return
			}
			rival.Nudge()
		}
	})
	return func() {
		cancel()
		wg.Wait()
		rival.Stop()
	}
}

// BenchmarkIdlePass measures one relay pass that finds nothing: the cost
// every relay process pays per PollInterval while the outbox is empty.
func BenchmarkIdlePass(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b, 4)
	relay := NewRelay(pool, nil, nil) // an empty pass never reaches the producer
	for b.Loop() {
		if _, _, _, err := relay.publishBatch(ctx, false); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPool opens a pool of size conns on a fresh migrated database.
func benchPool(b *testing.B, conns int32) *pgxpool.Pool {
	b.Helper()
	_, url := testkit.Pool(b)
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	config.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// listen LISTENs on channel "outbox" of pool's database on a connection of
// its own and calls heard for each notification, until the returned stop
// is called.
func listen(b *testing.B, pool *pgxpool.Pool, heard func()) (stop func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN outbox"); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return // cancelled by stop
			}
			heard()
		}
	}()
	return func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	}
}

// timedProducer notes when SendMessages returned for each row; the row's
// payload is its sequence number in the benchmark.
type timedProducer struct {
	sarama.SyncProducer
	mu   sync.Mutex
	at   map[int]time.Time
	sent chan struct{}
}

func (p *timedProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	if err := p.SyncProducer.SendMessages(msgs); err != nil {
		return err
	}
	now := time.Now()
	p.mu.Lock()
	if p.at == nil {
		p.at = map[int]time.Time{}
	}
	for _, m := range msgs {
		v, _ := m.Value.Encode()
		seq, _ := strconv.Atoi(string(v))
		if _, seen := p.at[seq]; !seen {
			p.at[seq] = now
		}
	}
	p.mu.Unlock()
	select {
	case p.sent <- struct{}{}:
	default:
	}
	return nil
}

func (p *timedProducer) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.at)
}

// waitFor waits until rows 0..n-1 were sent and returns their send times.
func (p *timedProducer) waitFor(b *testing.B, n int) []time.Time {
	timeout := time.After(30 * time.Second)
	for {
		p.mu.Lock()
		got := len(p.at)
		if got >= n {
			out := make([]time.Time, n)
			for i := range out {
				out[i] = p.at[i]
			}
			p.mu.Unlock()
			return out
		}
		p.mu.Unlock()
		select {
		case <-p.sent:
		case <-timeout:
			b.Fatalf("the relay sent %d of %d rows", got, n)
		}
	}
}
