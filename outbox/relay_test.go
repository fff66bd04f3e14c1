package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/startstop/startstoptest"
	"github.com/promptline/promptline/internal/testkit"
)

const (
	testTopic      = "wakes"
	testPartitions = 4
	// waitFor bounds every wait on the relay; a pass takes milliseconds.
	waitFor = 15 * time.Second
)

type testBundle struct {
	pool     *pgxpool.Pool
	broker   *testkit.TestBroker
	producer sarama.SyncProducer
	logs     *logRecorder
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	broker := testkit.Broker(t, testPartitions)
	return &testBundle{
		pool:     pool,
		broker:   broker,
		producer: newProducer(t, broker.Addr()),
		logs:     &logRecorder{},
	}
}

func newProducer(t *testing.T, addr string) sarama.SyncProducer {
	t.Helper()
	p, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("outbox-test"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// newRelay builds a relay whose loop reports when it goes idle.
func (b *testBundle) newRelay(config *RelayConfig) *Relay {
	c := *config
	c.Logger = slog.New(b.logs)
	r := NewRelay(b.pool, b.producer, &c)
	r.idleSignal = make(chan struct{}, 100)
	return r
}

func waitIdle(t *testing.T, r *Relay) {
	t.Helper()
	select {
	case <-r.idleSignal:
	case <-time.After(waitFor):
		t.Fatal("relay loop never went idle")
	}
}

// commit inserts rows in one transaction.
func commit(t *testing.T, pool *pgxpool.Pool, rows ...Row) {
	t.Helper()
	require.NoError(t, commitRows(context.Background(), pool, rows...))
}

// commitRows is commit for goroutines other than the test's.
func commitRows(ctx context.Context, pool *pgxpool.Pool, rows ...Row) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return Insert(ctx, tx, rows...) })
}

func row(key string, n int) Row {
	return Row{Topic: testTopic, Key: key, Payload: fmt.Appendf(nil, "%s/%d", key, n)}
}

type dbRow struct {
	ID        int64
	Key       string
	Published bool
}

func outboxRows(t *testing.T, pool *pgxpool.Pool) []dbRow {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT id, key, published_at IS NOT NULL FROM outbox ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dbRow])
	require.NoError(t, err)
	return out
}

func unpublished(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return testkit.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
}

type received struct {
	Partition int32
	ID        int64
	Key       string
	Payload   string
}

// readTopic reads every record of topic from the broker at addr, up to
// the high water marks (testkit.ReadAll). Callers have seen their
// publishes acknowledged, so the high water marks are final; the total is
// checked against want, which catches duplicates and strays as well as
// losses.
func readTopic(t *testing.T, addr, topic string, want int) []received {
	t.Helper()
	var out []received
	for _, m := range testkit.ReadAll(t, addr, topic) {
		out = append(out, toReceived(t, m))
	}
	require.Len(t, out, want, "records on %s", topic)
	return out
}

func toReceived(t *testing.T, m *sarama.ConsumerMessage) received {
	t.Helper()
	var id int64 = -1
	for _, h := range m.Headers {
		if string(h.Key) == HeaderOutboxID {
			var err error
			id, err = strconv.ParseInt(string(h.Value), 10, 64)
			require.NoError(t, err)
		}
	}
	require.NotEqual(t, int64(-1), id, "record without %s header", HeaderOutboxID)
	return received{Partition: m.Partition, ID: id, Key: string(m.Key), Payload: string(m.Value)}
}

// requireKeyOrder checks that every key lives on its murmur2 partition and
// that its records there follow ID order, with no repeats.
func requireKeyOrder(t *testing.T, got []received) {
	t.Helper()
	last := map[string]int64{}
	for _, r := range got {
		require.Equal(t, kafkautil.Murmur2Partition([]byte(r.Key), testPartitions), r.Partition, "partition of key %s", r.Key)
		require.Greater(t, r.ID, last[r.Key], "key %s: id %d after %d", r.Key, r.ID, last[r.Key])
		last[r.Key] = r.ID
	}
}

func ids(got []received) []int64 {
	out := make([]int64, len(got))
	for i, r := range got {
		out[i] = r.ID
	}
	return out
}

func dbIDs(rows []dbRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// logRecorder is a slog.Handler that keeps records for assertions.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level < slog.LevelWarn {
			continue
		}
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			msg += " " + a.String()
			return true
		})
		out = append(out, msg)
	}
	return out
}

func TestRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// P6: a row Kafka will never accept must not block the rows behind it.
	t.Run("OversizeRowIsQuarantinedAndTheRestGoOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{MaxMessageBytes: 1024})
		big := Row{Topic: testTopic, Key: "a", Payload: make([]byte, 2000)}
		commit(t, b.pool, row("a", 1), big, row("a", 2))
		require.NoError(t, relay.Flush(ctx))
		require.NoError(t, relay.Flush(ctx))

		got := readTopic(t, b.broker.Addr(), testTopic, 2)
		require.Equal(t, []int64{1, 3}, ids(got), "the rows around it went out, in order")
		var reason string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT quarantine_reason FROM outbox WHERE id = 2 AND published_at IS NULL`).Scan(&reason))
		require.Contains(t, reason, "exceeds the producer's limit of 1024")
		require.Zero(t, unpublished(t, b.pool)-1, "only the quarantined row is unpublished")
	})

	t.Run("RowRefusedByTheProducerIsQuarantined", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The relay's own limit is above the producer's (1,000,000): the
		// producer refuses the row, the relay quarantines it and marks the
		// rows that were sent.
		relay := b.newRelay(&RelayConfig{MaxMessageBytes: 10 << 20})
		commit(t, b.pool, row("k", 1), Row{Topic: testTopic, Key: "k", Payload: make([]byte, 2<<20)}, row("k", 2))
		require.NoError(t, relay.Flush(ctx))
		got := readTopic(t, b.broker.Addr(), testTopic, 2)
		require.ElementsMatch(t, []int64{1, 3}, ids(got))
		var reason string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT quarantine_reason FROM outbox WHERE id = 2`).Scan(&reason))
		require.Contains(t, reason, "refused by the producer or the broker")
		require.Equal(t, 1, unpublished(t, b.pool))
	})

	t.Run("RowsCommittedOutOfIDOrderArePublished", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{})

		// tx1 takes the lower ID but commits last: a relay that kept an
		// "id > last seen" cursor would skip it for ever.
		tx1, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx1.Rollback(ctx) }()
		require.NoError(t, Insert(ctx, tx1, row("early", 1)))
		commit(t, b.pool, row("late", 1))

		require.NoError(t, relay.Flush(ctx))
		rows := outboxRows(t, b.pool)
		require.Equal(t, []dbRow{{ID: 2, Key: "late", Published: true}}, rows)

		require.NoError(t, tx1.Commit(ctx))
		require.NoError(t, relay.Flush(ctx))
		rows = outboxRows(t, b.pool)
		require.Equal(t, []dbRow{{ID: 1, Key: "early", Published: true}, {ID: 2, Key: "late", Published: true}}, rows)

		got := readTopic(t, b.broker.Addr(), testTopic, 2)
		require.ElementsMatch(t, []int64{1, 2}, ids(got))
	})

	t.Run("PerKeyOrderOnAPartitionIsIDOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A small batch makes the loop run several full passes back to back.
		relay := b.newRelay(&RelayConfig{BatchSize: 7, PollInterval: time.Hour})

		keys := []string{"s-1", "s-2", "s-3", "s-4", "s-5", "s-6", "s-7", "s-8"}
		want := 0
		for tx := range 20 {
			var rows []Row
			for i := range 3 {
				k := keys[(tx*3+i*5)%len(keys)]
				rows = append(rows, row(k, tx*10+i))
			}
			commit(t, b.pool, rows...)
			want += len(rows)
		}
		var (
			mu      sync.Mutex
			batches []int
			ages    []time.Duration
		)
		relay.config.OnPublished = func(n int, oldest time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			batches = append(batches, n)
			ages = append(ages, oldest)
		}
		require.NoError(t, relay.Start(ctx))
		defer relay.Stop()
		waitIdle(t, relay)
		require.Zero(t, unpublished(t, b.pool))
		mu.Lock()
		require.Equal(t, []int{7, 7, 7, 7, 7, 7, 7, 7, 4}, batches)
		for _, age := range ages {
			require.Positive(t, age)
		}
		mu.Unlock()

		got := readTopic(t, b.broker.Addr(), testTopic, want)
		requireKeyOrder(t, got)
		require.ElementsMatch(t, dbIDs(outboxRows(t, b.pool)), ids(got))
		for _, r := range got {
			require.Contains(t, r.Payload, r.Key+"/")
		}
	})

	t.Run("RolledBackRowsAreNeverPublished", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{})

		// Still open while the relay passes: not visible, and not waited on.
		open, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, Insert(ctx, open, row("ghost", 1), row("ghost", 2)))
		commit(t, b.pool, row("real", 1))
		require.NoError(t, relay.Flush(ctx))
		require.NoError(t, open.Rollback(ctx))
		commit(t, b.pool, row("real", 2))
		require.NoError(t, relay.Flush(ctx))

		got := readTopic(t, b.broker.Addr(), testTopic, 2)
		require.Equal(t, []string{"real/1", "real/2"}, []string{got[0].Payload, got[1].Payload})
		require.Equal(t, []dbRow{{ID: 3, Key: "real", Published: true}, {ID: 4, Key: "real", Published: true}}, outboxRows(t, b.pool))
	})

	t.Run("FlushWaitsForTheLockHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{})
		commit(t, b.pool, row("k", 1))

		// Another relay's pass, as far as Postgres can tell.
		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, RelayLockKey)
		require.NoError(t, err)

		shortCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, relay.Flush(shortCtx), context.DeadlineExceeded)
		require.Equal(t, 1, unpublished(t, b.pool))

		require.NoError(t, holder.Rollback(ctx))
		require.NoError(t, relay.Flush(ctx))
		require.Zero(t, unpublished(t, b.pool))
		readTopic(t, b.broker.Addr(), testTopic, 1)
	})

	t.Run("TwoRelaysPublishEveryRowInKeyOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Two consumer processes: own pools, own producers, one database.
		poolB, err := pgxpool.New(ctx, b.pool.Config().ConnString())
		require.NoError(t, err)
		defer poolB.Close()
		var published [2]int
		var mu sync.Mutex
		onPublished := func(i int) func(int, time.Duration) {
			return func(n int, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				published[i] += n
			}
		}
		relays := []*Relay{
			NewRelay(b.pool, b.producer, &RelayConfig{BatchSize: 5, PollInterval: 5 * time.Millisecond, Logger: slog.New(b.logs), OnPublished: onPublished(0)}),
			NewRelay(poolB, newProducer(t, b.broker.Addr()), &RelayConfig{BatchSize: 5, PollInterval: 5 * time.Millisecond, Logger: slog.New(b.logs), OnPublished: onPublished(1)}),
		}
		for _, r := range relays {
			require.NoError(t, r.Start(ctx))
			defer r.Stop()
		}

		// Each writer owns its keys, as sessions own theirs: writes of one
		// key are serialised, so ID order is commit order per key.
		const writers, txPerWriter = 4, 25
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				for i := range txPerWriter {
					k := fmt.Sprintf("w%d-k%d", w, i%3)
					if err := commitRows(ctx, b.pool, row(k, 2*i), row(k, 2*i+1)); err != nil {
						errs <- err
						return
					}
					relays[(w+i)%2].Nudge()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := writers * txPerWriter * 2
		require.Eventually(t, func() bool { return unpublished(t, b.pool) == 0 }, waitFor, 5*time.Millisecond)

		got := readTopic(t, b.broker.Addr(), testTopic, want)
		requireKeyOrder(t, got)
		require.ElementsMatch(t, dbIDs(outboxRows(t, b.pool)), ids(got))
		mu.Lock()
		require.Equal(t, want, published[0]+published[1])
		t.Logf("rows published by relay A: %d, by relay B: %d", published[0], published[1])
		mu.Unlock()
		require.Empty(t, b.logs.warnings())
	})

	t.Run("StopTwiceFlushesFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{PollInterval: time.Hour})
		relay.Stop() // before Start: nothing to stop

		require.NoError(t, relay.Start(ctx))
		require.Error(t, relay.Start(ctx), "second Start while running")
		waitIdle(t, relay) // first pass done; next look in an hour
		commit(t, b.pool, row("k", 1), row("k", 2), row("j", 1))
		require.Equal(t, 3, unpublished(t, b.pool))

		relay.Stop()
		require.Zero(t, unpublished(t, b.pool))
		relay.Stop()
		got := readTopic(t, b.broker.Addr(), testTopic, 3)
		requireKeyOrder(t, got)
		require.Empty(t, b.logs.warnings())

		// Stopped relays start again.
		require.NoError(t, relay.Start(ctx))
		relay.Stop()
	})

	t.Run("NudgeWakesTheLoopBeforeThePoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{PollInterval: time.Hour})
		require.NoError(t, relay.Start(ctx))
		defer relay.Stop()
		waitIdle(t, relay)

		for i := range 3 {
			commit(t, b.pool, row("k", i))
			start := time.Now()
			relay.Nudge()
			waitIdle(t, relay)
			// With an hour between polls, only the nudge can have woken it.
			require.Zero(t, unpublished(t, b.pool), "after nudge %d", i)
			require.Less(t, time.Since(start), waitFor)
		}
		readTopic(t, b.broker.Addr(), testTopic, 3)
	})

	// Rows committed here while another relay's pass holds the lock may
	// have missed that pass: the nudged relay waits for the lock and
	// publishes them right after, not at its next poll.
	t.Run("NudgedRelayWaitsForTheLockHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{PollInterval: time.Hour})
		require.NoError(t, relay.Start(ctx))
		defer relay.Stop()
		waitIdle(t, relay)

		holder, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(ctx) }()
		_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, RelayLockKey)
		require.NoError(t, err)
		commit(t, b.pool, row("k", 1))
		relay.Nudge()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&n))
			return n == 1
		}, waitFor, 5*time.Millisecond, "the nudged relay waits for the lock")
		require.Equal(t, 1, unpublished(t, b.pool))

		require.NoError(t, holder.Rollback(ctx))
		// With an hour between polls, only the wait for the lock can
		// have published it.
		require.Eventually(t, func() bool { return unpublished(t, b.pool) == 0 }, waitFor, 5*time.Millisecond)
		readTopic(t, b.broker.Addr(), testTopic, 1)
	})

	t.Run("NudgeNeverBlocks", func(t *testing.T) {
		t.Parallel()
		// No loop runs to receive: nudges coalesce into the one pending.
		relay := NewRelay(nil, nil, nil)
		for range 1000 {
			relay.Nudge()
		}
		require.Len(t, relay.nudge, 1)
	})

	// A send that outlasts the pass's transaction (a broker slow to
	// answer, the server's idle-in-transaction timeout shorter) must not
	// leave what Kafka took unmarked: every later pass would send it
	// again and, as slow, never mark it.
	t.Run("SendOutlastingItsTransactionIsMarkedAllTheSame", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.pool.Config()
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "300"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		relay := NewRelay(pool, b.producer, &RelayConfig{PollInterval: 10 * time.Millisecond, Logger: slog.New(b.logs), MaxMessageBytes: 1000})
		// After the send, wait until the server has ended the pass's
		// transaction (its backend gone: no session idle in a
		// transaction is left).
		relay.afterSend = func() {
			assert.Eventually(t, func() bool {
				var n int
				return b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&n) == nil && n == 0
			}, waitFor, 5*time.Millisecond, "the pass's transaction outlived the timeout")
		}
		commit(t, b.pool, row("k", 1), row("k", 2), Row{Topic: testTopic, Key: "big", Payload: make([]byte, 2000)})
		require.NoError(t, relay.Flush(ctx))
		require.Equal(t, 1, unpublished(t, b.pool), "rows Kafka took are left unmarked")
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL`),
			"the row too large to send is not quarantined")
		got := readTopic(t, b.broker.Addr(), testTopic, 2)
		require.Len(t, got, 2, "published once each")
		require.NoError(t, relay.Flush(ctx))
		require.Len(t, readTopic(t, b.broker.Addr(), testTopic, 2), 2, "sent again by the next pass")
	})

	t.Run("PublishFailureLeavesRowsForARetry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{PollInterval: 10 * time.Millisecond})
		require.NoError(t, relay.Start(ctx))
		defer relay.Stop()
		waitIdle(t, relay)

		addr := b.broker.Addr()
		b.broker.Close()
		commit(t, b.pool, row("k", 1), row("k", 2))
		relay.Nudge()
		require.Eventually(t, func() bool { return len(b.logs.warnings()) > 0 }, waitFor, 10*time.Millisecond)
		require.Contains(t, b.logs.warnings()[0], "publish failed")
		require.Equal(t, 2, unpublished(t, b.pool), "a failed publish marks nothing")

		// The broker comes back on the same address.
		require.NoError(t, b.broker.Restart())
		require.Eventually(t, func() bool { return unpublished(t, b.pool) == 0 }, 30*time.Second, 10*time.Millisecond)
		got := readTopic(t, addr, testTopic, 2)
		requireKeyOrder(t, got)
		relay.Stop()
		for _, w := range b.logs.warnings() {
			require.NotContains(t, w, context.Canceled.Error())
		}
	})
}

// quarantineReason is the reason of outbox row id ("" when not quarantined)
// and whether it is published.
func quarantineReason(t *testing.T, pool *pgxpool.Pool, id int64) (reason string, published bool) {
	t.Helper()
	var r *string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT quarantine_reason, published_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&r, &published))
	if r != nil {
		reason = *r
	}
	return reason, published
}

// createTopic creates topic on the broker at addr with the given configs.
func createTopic(t *testing.T, addr, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin([]string{addr}, kafkautil.NewConfig("outbox-test-admin"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic(topic, &sarama.TopicDetail{
		NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs,
	}, false))
}

// Not parallel: the stress test's leak check counts every goroutine.
func TestRelayStartStop(t *testing.T) {
	t.Run("Stress", func(t *testing.T) {
		ctx := context.Background()
		b := setup(t)
		relay := NewRelay(b.pool, b.producer, &RelayConfig{PollInterval: time.Millisecond, Logger: slog.New(b.logs)})
		keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
		for i, k := range keys {
			commit(t, b.pool, row(k, i))
		}
		// The producer starts goroutines for each partition it first
		// sends to: send to these before the leak check's snapshot.
		require.NoError(t, relay.Flush(ctx))
		for i, k := range keys {
			commit(t, b.pool, row(k, len(keys)+i))
		}

		// The embedded broker reads each request in a goroutine that
		// waits for the next one: the producer's requests leave one per
		// connection, which ends with the producer.
		startstoptest.Stress(t, relay, goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).read.func1"))
		require.Zero(t, unpublished(t, b.pool), "each Stop makes a last pass")
		readTopic(t, b.broker.Addr(), testTopic, 2*len(keys))
		require.Empty(t, b.logs.warnings())
	})
}

// Partial failures of a publish: what Kafka took is marked, what it
// refused waits, in order per key, or is quarantined, and nothing blocks
// the relay (P6, invariant 13).
func TestRelayPartialFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// A row for a topic that does not exist (the broker creates no topic
	// by itself): Sarama calls the error retriable, so it is retried, but
	// it must neither hold back the rows of other keys nor stay for ever.
	t.Run("RowForAMissingTopicHoldsBackOnlyItsKeyThenIsQuarantined", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{FailingRowQuarantineAfter: 2 * time.Second})
		commit(t, b.pool,
			Row{Topic: "no-such-topic", Key: "bad", Payload: []byte("lost")}, // id 1
			row("good", 1), // id 2
			row("bad", 2),  // id 3: behind id 1 in its key
		)
		require.NoError(t, relay.Flush(ctx))
		_, published := quarantineReason(t, b.pool, 2)
		require.True(t, published, "the row of another key went out and is marked")
		reason, published := quarantineReason(t, b.pool, 1)
		require.False(t, published)
		require.Empty(t, reason, "one failed pass quarantines nothing")
		_, published = quarantineReason(t, b.pool, 3)
		require.False(t, published, "a later row of the failed row's key waits for it")

		// Kafka keeps taking other rows meanwhile: the refusal is the
		// row's, not the cluster's.
		others := 0
		require.Eventually(t, func() bool {
			others++
			commit(t, b.pool, row(fmt.Sprintf("other-%d", others), 1))
			require.NoError(t, relay.Flush(ctx))
			reason, _ := quarantineReason(t, b.pool, 1)
			return reason != ""
		}, waitFor, 10*time.Millisecond)
		reason, _ = quarantineReason(t, b.pool, 1)
		require.Contains(t, reason, "topic no-such-topic")

		require.NoError(t, relay.Flush(ctx))
		_, published = quarantineReason(t, b.pool, 3)
		require.True(t, published, "once the failed row is quarantined, its key goes on")
		// Row 3 went out with row 1 on the first pass but was not marked;
		// while row 1 kept failing it was not sent again, and once row 1
		// was set aside it was: one duplicate, published after row 1's
		// fate was decided.
		got := readTopic(t, b.broker.Addr(), testTopic, 3+others)
		var bad []int64
		for _, r := range got {
			if r.Key == "bad" {
				bad = append(bad, r.ID)
			}
		}
		require.Equal(t, []int64{3, 3}, bad)
		require.Equal(t, 1, unpublished(t, b.pool))
	})

	// More refused rows than a batch holds must not keep the rows of other
	// keys out of every pass.
	t.Run("RefusedRowsDoNotFillEveryBatch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{BatchSize: 2, FailingRowQuarantineAfter: time.Hour})
		bad := func(key string) Row { return Row{Topic: "no-such-topic", Key: key, Payload: []byte(key)} }
		commit(t, b.pool, bad("k1"), bad("k2"), bad("k3"), row("k1", 2), row("good", 1)) // ids 1..5
		require.Eventually(t, func() bool {
			_ = relay.Flush(ctx) // passes that settle nothing report their error
			_, published := quarantineReason(t, b.pool, 5)
			return published
		}, waitFor, 10*time.Millisecond, "the row of another key went out")
		for _, id := range []int64{1, 2, 3, 4} {
			reason, published := quarantineReason(t, b.pool, id)
			require.False(t, published, "row %d", id)
			require.Empty(t, reason, "row %d: an hour has not passed", id)
		}
	})

	// Once a topic has refused rows for the whole window, a new row for it
	// is set aside at its first refusal instead of holding its key back for
	// another window: a missing events topic must not slow every session
	// down by one window per event.
	t.Run("RowForATopicRefusedForTheWholeWindowIsQuarantinedAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		relay := b.newRelay(&RelayConfig{FailingRowQuarantineAfter: time.Second})
		others := 0
		other := func() Row {
			others++
			return row(fmt.Sprintf("other-%d", others), 1)
		}
		commit(t, b.pool, Row{Topic: "no-such-topic", Key: "k1", Payload: []byte("1")}, other()) // ids 1, 2
		require.Eventually(t, func() bool {
			commit(t, b.pool, other())
			require.NoError(t, relay.Flush(ctx))
			reason, _ := quarantineReason(t, b.pool, 1)
			return reason != ""
		}, waitFor, 10*time.Millisecond)

		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('no-such-topic', 'k2', '2') RETURNING id`).Scan(&id))
		commit(t, b.pool, row("k2", 2))
		require.NoError(t, relay.Flush(ctx))
		reason, published := quarantineReason(t, b.pool, id)
		require.False(t, published)
		require.Contains(t, reason, "topic no-such-topic")
		require.NoError(t, relay.Flush(ctx))
		_, published = quarantineReason(t, b.pool, id+1)
		require.True(t, published, "its key goes on")
	})

	// The broker refuses a produce set for size when one of its messages
	// is over the topic's limit (below the producer's): the set is sent
	// again one by one, and only the message that fails alone is
	// quarantined.
	t.Run("OversizeForTheTopicQuarantinesOnlyTheLargeRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		limit := "2000"
		createTopic(t, b.broker.Addr(), "small-events", 1, map[string]*string{"max.message.bytes": &limit})
		// Batch generously, so that one produce request carries the whole
		// pass, as it does under load.
		cfg := kafkautil.NewConfig("outbox-test-batching")
		cfg.Producer.Flush.Frequency = 100 * time.Millisecond
		producer, err := sarama.NewSyncProducer([]string{b.broker.Addr()}, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = producer.Close() })
		relay := NewRelay(b.pool, producer, &RelayConfig{Logger: slog.New(b.logs)})

		ev := func(key string, n int) Row {
			return Row{Topic: "small-events", Key: key, Payload: fmt.Appendf(nil, "%s/%d", key, n)}
		}
		commit(t, b.pool,
			ev("s1", 1), // id 1
			Row{Topic: "small-events", Key: "s2", Payload: make([]byte, 5000)}, // id 2
			ev("s3", 1), // id 3
			ev("s2", 2), // id 4
			ev("s4", 1), // id 5
		)
		require.NoError(t, relay.Flush(ctx))
		require.NoError(t, relay.Flush(ctx))

		reason, published := quarantineReason(t, b.pool, 2)
		require.False(t, published)
		require.Contains(t, reason, "refused by the producer or the broker")
		for _, id := range []int64{1, 3, 4, 5} {
			reason, published := quarantineReason(t, b.pool, id)
			require.Empty(t, reason, "row %d", id)
			require.True(t, published, "row %d", id)
		}
		got := readTopic(t, b.broker.Addr(), "small-events", 4)
		require.Equal(t, []int64{1, 3, 4, 5}, ids(got), "one partition: ID order")
	})

	// CORRUPT_MESSAGE is retriable: a pass that ends on it quarantines
	// nothing.
	t.Run("InvalidMessageIsNotPermanent", func(t *testing.T) {
		t.Parallel()
		require.False(t, permanent(sarama.ErrInvalidMessage))
		require.True(t, permanent(sarama.ErrMessageSizeTooLarge))
		require.False(t, permanent(sarama.ErrUnknownTopicOrPartition))
	})
}
