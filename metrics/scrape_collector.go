package metrics

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DatabaseStats are gauges read from the database at scrape time. They
// describe the whole database, not this process: every replica reports the
// same values, so aggregate them with max(), never sum().
type DatabaseStats struct {
	// OutboxBacklog is the number of unpublished outbox rows.
	OutboxBacklog int64
	// OutboxOldestUnpublished is the age of the oldest unpublished outbox
	// row (zero when none) whose created_at is a time.
	OutboxOldestUnpublished time.Duration
	// PermissionsPending is the number of permission requests waiting for a
	// reply.
	PermissionsPending int64
}

// ScrapeConfig configures a ScrapeCollector.
type ScrapeConfig struct {
	// DatabaseFunc reads the database gauges. Defaults to nil (none are
	// exported).
	DatabaseFunc func(ctx context.Context) (DatabaseStats, error)
	// ReadyFunc says whether this process is ready (nil error), for
	// promptline_ready. Defaults to nil (promptline_ready is not exported).
	ReadyFunc func(ctx context.Context) error
	// Timeout bounds each function per scrape, so that a slow database
	// cannot stall the scrape of every other metric. Defaults to 2s.
	Timeout time.Duration
}

// ScrapeCollector computes gauges when Prometheus scrapes: the database
// gauges (queried then, so they are right after a restart and need no
// loop of their own) and readiness. A failed database read exports
// promptline_database_stats_up 0 and leaves the database gauges out rather
// than failing the whole scrape.
type ScrapeCollector struct {
	cfg ScrapeConfig

	ready, statsUp, backlog, oldest, pending *prometheus.Desc
}

var _ prometheus.Collector = (*ScrapeCollector)(nil)

const scrapeTimeoutDefault = 2 * time.Second

// NewScrapeCollector returns a collector; register it on the registry that
// New registered on.
func NewScrapeCollector(config *ScrapeConfig) *ScrapeCollector {
	var c ScrapeConfig
	if config != nil {
		c = *config
	}
	c.Timeout = cmp.Or(c.Timeout, scrapeTimeoutDefault)
	return &ScrapeCollector{
		cfg: c,
		ready: prometheus.NewDesc("promptline_ready",
			"1 when this consumer is ready (Postgres reachable, migrations applied, Kafka group joined), else 0.", nil, nil),
		statsUp: prometheus.NewDesc("promptline_database_stats_up",
			"1 when the last scrape read the database gauges, 0 when the read failed or timed out.", nil, nil),
		backlog: prometheus.NewDesc("promptline_outbox_backlog_rows",
			"Unpublished outbox rows (database-wide).", nil, nil),
		oldest: prometheus.NewDesc("promptline_outbox_oldest_unpublished_seconds",
			"Age of the oldest unpublished outbox row, 0 when none (database-wide).", nil, nil),
		pending: prometheus.NewDesc("promptline_permission_requests_pending",
			"Permission requests waiting for a reply (database-wide).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ScrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.cfg.ReadyFunc != nil {
		ch <- c.ready
	}
	if c.cfg.DatabaseFunc != nil {
		ch <- c.statsUp
		ch <- c.backlog
		ch <- c.oldest
		ch <- c.pending
	}
}

// Collect implements prometheus.Collector.
func (c *ScrapeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.cfg.ReadyFunc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		v := 0.0
		if c.cfg.ReadyFunc(ctx) == nil {
			v = 1
		}
		cancel()
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, v)
	}
	if c.cfg.DatabaseFunc != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		s, err := c.cfg.DatabaseFunc(ctx)
		cancel()
		if err != nil {
			ch <- prometheus.MustNewConstMetric(c.statsUp, prometheus.GaugeValue, 0)
			return
		}
		ch <- prometheus.MustNewConstMetric(c.statsUp, prometheus.GaugeValue, 1)
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(s.OutboxBacklog))
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, s.OutboxOldestUnpublished.Seconds())
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(s.PermissionsPending))
	}
}
