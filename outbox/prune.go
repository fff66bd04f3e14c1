package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/startstop"
)

// Published rows are deleted once they were published longer ago than the
// retention. The outbox is the transport to Kafka, not an archive: Kafka
// keeps what was published, under each topic's retention. Without pruning
// the table grows by every event and wake ever written, three rows or more
// per prompt. Unpublished and quarantined rows are never pruned; a
// published row whose published_at is not a time is pruned as an old one.

const (
	pruneBatchDefault      = 5000
	pruneMaxBatchesDefault = 100
	pruneIntervalMax       = time.Minute
)

// PrunerConfig configures a Pruner.
type PrunerConfig struct {
	// Retention is how long a published row is kept; it must be positive.
	Retention time.Duration
	// Interval is the time between passes. Defaults to the retention, at
	// most a minute.
	Interval time.Duration
	// BatchSize is the most rows one DELETE removes (one short transaction
	// each, so that pruning never holds many row locks for long). Defaults
	// to 5,000.
	BatchSize int
	// MaxBatches bounds the DELETEs of one pass; the next pass goes on.
	// Defaults to 100.
	MaxBatches int
	// Logger receives failed passes (Warn). Defaults to discarding.
	Logger *slog.Logger
	// OnPruned, when set, is called after each DELETE with the rows it
	// removed, for metrics.
	OnPruned func(n int)
}

// PruneLockKey is the advisory lock (single bigint form) each pruning batch
// tries to take in its transaction: every consumer runs a pruner, and a
// pruner that finds another's batch running ends its pass instead of
// walking, and waiting on, the same rows. "outprn" in ASCII.
const PruneLockKey int64 = 0x6f757470726e

// Pruner deletes published outbox rows older than the retention. Every
// consumer runs one; at any moment one of them prunes (PruneLockKey).
type Pruner struct {
	pool *pgxpool.Pool
	cfg  PrunerConfig
	loop startstop.Loop
}

// NewPruner returns a Pruner, or an error when the retention is not positive.
func NewPruner(pool *pgxpool.Pool, config *PrunerConfig) (*Pruner, error) {
	c := *config
	if c.Retention <= 0 {
		return nil, fmt.Errorf("outbox: PrunerConfig.Retention must be positive, not %v", c.Retention)
	}
	c.Interval = cmp.Or(c.Interval, min(c.Retention, pruneIntervalMax))
	c.BatchSize = cmp.Or(c.BatchSize, pruneBatchDefault)
	c.MaxBatches = cmp.Or(c.MaxBatches, pruneMaxBatchesDefault)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return &Pruner{pool: pool, cfg: c}, nil
}

// Prune runs one pass over the oldest rows, in batches of BatchSize by ID
// (each one short transaction): it deletes those published longer ago than
// the retention, steps over quarantined ones, and stops at the first batch
// that holds a row to keep (unpublished, or published too recently): the
// rows after it are younger. At most MaxBatches batches; the next pass goes
// on. It returns the rows removed.
func (p *Pruner) Prune(ctx context.Context) (int, error) {
	total := 0
	var after int64
	for range p.cfg.MaxBatches {
		var (
			deleted, kept int
			last          *int64
		)
		err := p.pool.QueryRow(ctx, pruneSQL, after, p.cfg.BatchSize, p.cfg.Retention.Milliseconds(), PruneLockKey).Scan(&deleted, &last, &kept)
		if err != nil {
			return total, fmt.Errorf("outbox: pruning published rows: %w", err)
		}
		total += deleted
		if deleted > 0 && p.cfg.OnPruned != nil {
			p.cfg.OnPruned(deleted)
		}
		if last == nil || kept > 0 {
			break
		}
		after = *last
	}
	return total, nil
}

// Start prunes every Interval, in a goroutine, until ctx ends or Stop is
// called; it returns at once, and fails while the pruner runs. A stopped
// pruner may be started again.
func (p *Pruner) Start(ctx context.Context) error {
	if err := p.loop.Start(ctx, p.run); err != nil {
		return fmt.Errorf("starting outbox pruner: %w", err)
	}
	return nil
}

// Stop ends the pruning loop, cancelling a pass under way, and waits for
// it. It may be called twice, and before Start.
func (p *Pruner) Stop() { p.loop.Stop() }

func (p *Pruner) run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := p.Prune(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "outbox pruning failed; retrying at the next interval", slog.Any("error", err))
		}
	}
}

// pruneSQL takes the next $2 rows by ID after $1 (an index range on the
// primary key: no index on published_at is needed, and the scan never runs
// past the batch), deletes those published before the cutoff, and reports
// the deleted count, the batch's last ID (none when another pruner holds
// $4) and how many of its rows must be kept that are not quarantined.
// A published_at that is not a time ('-infinity' or 'infinity': the column
// admits both, and a hand edit, a restore or a repair script may leave
// one) is old: it says nothing of when the row was published, so no
// retention can be counted from it. Kept, an 'infinity' row would stop
// every pass at its batch, and nothing published after it would be
// pruned again (invariant 10).
const pruneSQL = `
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($4) AS ok
), batch AS (
    SELECT id, published_at < now() - $3 * interval '1 millisecond' OR NOT isfinite(published_at) AS old,
           quarantine_reason IS NOT NULL AS quarantined
    FROM outbox WHERE id > $1 AND (SELECT ok FROM lock) ORDER BY id LIMIT $2
), gone AS (
    DELETE FROM outbox o USING batch b WHERE o.id = b.id AND b.old RETURNING o.id
)
SELECT (SELECT count(*) FROM gone), (SELECT max(id) FROM batch),
       (SELECT count(*) FROM batch WHERE old IS NOT TRUE AND NOT quarantined)`
