package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/metrics"
)

// readiness answers /readyz and promptline_ready: Postgres reachable, the
// migrations this binary embeds applied, and the Kafka consumer group
// joined (the handler's Setup ran for the current generation and its
// Cleanup has not), and no broker leaving a request of this process
// unanswered for longer than the watch's bound (5s).
type readiness struct {
	pool   *pgxpool.Pool
	latest int64 // the newest embedded migration version

	joined     atomic.Bool
	generation atomic.Int32
	// hung names a broker that has left a request of this process
	// unanswered for long (kafkautil.BrokerWatch.Hung); nil: not asked.
	hung func() (string, time.Duration)
}

func newReadiness(pool *pgxpool.Pool) (*readiness, error) {
	latest, err := latestMigration(pgdb.Migrations())
	if err != nil {
		return nil, err
	}
	return &readiness{pool: pool, latest: latest}, nil
}

// latestMigration is the highest version among goose's NNNNN_name.sql files.
func latestMigration(fsys fs.FS) (int64, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return 0, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var latest int64
	for _, e := range entries {
		digits := 0
		for digits < len(e.Name()) && e.Name()[digits] >= '0' && e.Name()[digits] <= '9' {
			digits++
		}
		if digits == 0 {
			continue
		}
		v, err := strconv.ParseInt(e.Name()[:digits], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		latest = max(latest, v)
	}
	if latest == 0 {
		return 0, errors.New("no embedded migrations")
	}
	return latest, nil
}

// goose's version table (its default name): one row per applied migration.
const migrationVersionSQL = `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`

// Check returns nil when ready, else the reason.
func (r *readiness) Check(ctx context.Context) error {
	var v int64
	if err := r.pool.QueryRow(ctx, migrationVersionSQL).Scan(&v); err != nil {
		//lint:ignore ST1005 a reason shown on /readyz, led by the name of the dependency
		return fmt.Errorf("Postgres: reading the migration version: %w", err)
	}
	if v < r.latest {
		return fmt.Errorf("migrations: the database is at version %d, this binary needs %d", v, r.latest)
	}
	if !r.joined.Load() {
		//lint:ignore ST1005 a reason shown on /readyz, led by the name of the dependency
		return errors.New("Kafka: consumer group not joined (no assignment for the current generation)")
	}
	if r.hung != nil {
		if addr, d := r.hung(); addr != "" {
			//lint:ignore ST1005 a reason shown on /readyz, led by the name of the dependency
			return fmt.Errorf("Kafka: broker %s has not answered a request for %s (stopped or cut off; its partitions stall until the cluster fences it)", addr, d.Round(time.Second))
		}
	}
	return nil
}

// databaseStatsSQL reads the database-wide gauges in one statement: the
// partial indexes outbox_unpublished and permission_requests_pending serve
// both parts; the scrape timeout bounds it on a huge backlog. The oldest
// age is that of the oldest row whose created_at is a time: the column
// admits '-infinity' and 'infinity' (a hand edit), whose age is no number
// of seconds, and the clock less either is an error that would fail every
// scrape; such a row still counts in the backlog.
const databaseStatsSQL = `
SELECT o.n, o.oldest, (SELECT count(*) FROM permission_requests WHERE status = 'pending')
FROM (SELECT count(*) AS n,
             coalesce(extract(epoch FROM clock_timestamp() - min(created_at) FILTER (WHERE isfinite(created_at))), 0)::float8 AS oldest
      FROM outbox WHERE published_at IS NULL AND quarantine_reason IS NULL) o`

// databaseStats reads the gauges of metrics.DatabaseStats.
func databaseStats(pool *pgxpool.Pool) func(ctx context.Context) (metrics.DatabaseStats, error) {
	return func(ctx context.Context) (metrics.DatabaseStats, error) {
		var s metrics.DatabaseStats
		var oldest float64
		if err := pool.QueryRow(ctx, databaseStatsSQL).Scan(&s.OutboxBacklog, &oldest, &s.PermissionsPending); err != nil {
			return s, fmt.Errorf("reading database gauges: %w", err)
		}
		s.OutboxOldestUnpublished = time.Duration(oldest * float64(time.Second))
		return s, nil
	}
}

// observedHandler wraps the pipeline's consumer-group handler for the
// operator's view, without changing what it does: Setup and Cleanup drive
// readiness, and each claimed partition reports its lag.
//
// Lag is the partition's high-water mark minus the next offset this member
// will mark (the offset after the last marked message; the claim's initial
// offset before any). It is refreshed at each mark and every
// lagRefreshInterval (the high-water mark grows while the handler is busy
// or stuck), and its series is removed when the claim ends (revoked).
type observedHandler struct {
	sarama.ConsumerGroupHandler
	ready *readiness
	lag   *prometheus.GaugeVec // promptline_kafka_consumer_lag_messages{topic,partition}; nil: none
}

const lagRefreshInterval = time.Second

func (h *observedHandler) Setup(s sarama.ConsumerGroupSession) error {
	if err := h.ConsumerGroupHandler.Setup(s); err != nil {
		return err
	}
	h.ready.generation.Store(s.GenerationID())
	h.ready.joined.Store(true)
	return nil
}

func (h *observedHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	h.ready.joined.Store(false)
	return h.ConsumerGroupHandler.Cleanup(s)
}

func (h *observedHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	if h.lag == nil {
		return h.ConsumerGroupHandler.ConsumeClaim(s, claim)
	}
	t := &markTracker{ConsumerGroupSession: s, claim: claim, lag: h.lag}
	t.next.Store(max(claim.InitialOffset(), 0))
	t.refresh()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(lagRefreshInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-s.Context().Done():
				return
			case <-tick.C:
				t.refresh()
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
		h.lag.DeleteLabelValues(claim.Topic(), strconv.Itoa(int(claim.Partition())))
	}()
	return h.ConsumerGroupHandler.ConsumeClaim(t, claim)
}

// markTracker is the session as one claim's handler sees it: MarkMessage
// and MarkOffset also record the next offset, for the lag.
type markTracker struct {
	sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	lag   *prometheus.GaugeVec
	next  atomic.Int64
}

func (t *markTracker) MarkMessage(msg *sarama.ConsumerMessage, metadata string) {
	t.ConsumerGroupSession.MarkMessage(msg, metadata)
	if msg.Topic == t.claim.Topic() && msg.Partition == t.claim.Partition() {
		t.next.Store(msg.Offset + 1)
		t.refresh()
	}
}

// MarkOffset is MarkMessage's by offset (the wakes' handler marks so):
// offset is the next to consume. As in Sarama, a lower offset than one
// marked already changes nothing.
func (t *markTracker) MarkOffset(topic string, partition int32, offset int64, metadata string) {
	t.ConsumerGroupSession.MarkOffset(topic, partition, offset, metadata)
	if topic != t.claim.Topic() || partition != t.claim.Partition() {
		return
	}
	for {
		next := t.next.Load()
		if offset <= next || t.next.CompareAndSwap(next, offset) {
			break
		}
	}
	t.refresh()
}

func (t *markTracker) refresh() {
	lag := max(t.claim.HighWaterMarkOffset()-t.next.Load(), 0)
	t.lag.WithLabelValues(t.claim.Topic(), strconv.Itoa(int(t.claim.Partition()))).Set(float64(lag))
}
