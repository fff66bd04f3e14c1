package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/faults"
)

// RelayLockKey is the Postgres advisory lock (single bigint form, scoped to
// the database) that a relay holds for the length of each publish
// transaction. Every consumer process runs a relay; were two to publish at
// once, each could send a later row of a key before the other sent an
// earlier one, breaking per-key order. The value is "outbox" in ASCII, far
// from goose's migration lock (5887940537704921958). Operators see it in
// pg_locks as locktype 'advisory', classid 0x6f75, objid 0x74626f78.
const RelayLockKey int64 = 0x6f7574626f78

// HeaderOutboxID is the Kafka header carrying the row's outbox ID (decimal).
// Publishing is at least once: a consumer that must drop repeats can key on
// it, and it lets anyone trace a message back to the row that announced it.
const HeaderOutboxID = "promptline-outbox-id"

const (
	batchSizeDefault = 500
	// pollIntervalDefault bounds the latency of rows nobody nudged: rows
	// committed by another process (measured p50 ~30ms, p99 ~56ms), for
	// one idle pass (~0.4ms) per interval per process. Rows committed here
	// are nudged (p50 ~2.4ms); when another relay holds the lock then, the
	// nudged relay waits for it instead of for the interval.
	// LISTEN/NOTIFY would serve both cases in ~2ms but halved commit
	// throughput: docs/benchmarks.md, "Outbox relay: polling vs
	// LISTEN/NOTIFY".
	pollIntervalDefault = 50 * time.Millisecond
	// stopFlushTimeout bounds the last pass Stop makes.
	stopFlushTimeout = 5 * time.Second
	// markTimeout bounds marking a sent batch, which outlives cancellation.
	markTimeout     = 5 * time.Second
	retryBackoffMin = 100 * time.Millisecond
	retryBackoffMax = 5 * time.Second
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// BatchSize is the number of rows per publish transaction: one
	// SendMessages call and one UPDATE. A full batch makes the loop go again
	// at once. Defaults to 500.
	BatchSize int
	// PollInterval is how long an idle relay waits before looking for rows
	// that no Nudge announced (those committed by other processes), and how
	// long a relay that was not nudged waits when another holds
	// RelayLockKey (a nudged one waits for the lock instead). Defaults to
	// 50ms.
	PollInterval time.Duration
	// Logger receives publish failures (Warn). Defaults to discarding.
	Logger *slog.Logger
	// OnPublished, when set, is called after each committed batch with the
	// number of rows and the age of the oldest (database clock, from the
	// start of the transaction that wrote it to its marking), for metrics.
	// It may be called from the loop and from Flush at once. Defaults to
	// nil (not called).
	OnPublished func(n int, oldest time.Duration)
	// MaxMessageBytes is the largest message the producer sends (Sarama's
	// Producer.MaxMessageBytes). A row that cannot fit is quarantined, not
	// sent: it would fail every pass and block the rows behind it.
	// Defaults to 1,000,000, Sarama's default.
	MaxMessageBytes int
}

// Relay publishes committed outbox rows to Kafka, at least once and in
// order per key, and marks them published.
//
// Each pass is one transaction: take RelayLockKey, select the oldest
// unpublished rows by ID, send them in one SendMessages call, mark them,
// commit. A crash between the send and the commit publishes the batch
// again (a harmless duplicate, DESIGN.md crash windows); a failed send rolls
// back and leaves every row for the next pass.
//
// Rows are found by "published_at IS NULL" (a partial index), never by an
// ID cursor: identity values are taken at insert, transactions commit in
// another order, and a cursor past a later ID would skip an earlier one
// that commits afterwards. Order per key is ID order among the rows each
// pass sees; writers of one key serialise on its session row, so their IDs
// follow commit order.
type Relay struct {
	pool     *pgxpool.Pool
	producer sarama.SyncProducer
	config   RelayConfig
	logger   *slog.Logger
	nudge    chan struct{}

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	// idleSignal, when set (by tests in this package), receives a value
	// each time the loop settles into waiting for a nudge or the poll timer,
	// so that tests can wait on the loop instead of sleeping.
	idleSignal chan struct{}
}

// NewRelay returns a Relay that reads pool's outbox and publishes through
// producer (build it from kafkautil.NewConfig, so that keys land on the
// partitions every other producer of promptline picks).
func NewRelay(pool *pgxpool.Pool, producer sarama.SyncProducer, config *RelayConfig) *Relay {
	var c RelayConfig
	if config != nil {
		c = *config
	}
	c.BatchSize = cmp.Or(c.BatchSize, batchSizeDefault)
	c.PollInterval = cmp.Or(c.PollInterval, pollIntervalDefault)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return &Relay{
		pool:     pool,
		producer: producer,
		config:   c,
		logger:   c.Logger,
		nudge:    make(chan struct{}, 1),
	}
}

// Start runs the relay loop in a goroutine until ctx is done or Stop is
// called, and returns at once. A stopped relay may be started again.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		select {
		case <-r.done:
		default:
			return errors.New("starting outbox relay: already running")
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.cancel, r.done = cancel, done
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	return nil
}

// Stop ends the loop and waits for it. Before exiting, the loop makes one
// last pass over what is committed (bounded by 5s) so that a graceful
// shutdown leaves nothing for the next process. Stop may be called twice,
// and before Start.
func (r *Relay) Stop() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
}

// Nudge tells the loop that rows were just committed in this process, so it
// looks at once instead of at the next poll. It never blocks, and nudges
// that arrive before the loop wakes count as one.
func (r *Relay) Nudge() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// Flush publishes everything committed before it was called and returns
// when a pass finds less than a full batch. Unlike the loop it waits for
// RelayLockKey instead of giving up, so it also waits out a pass running in
// another relay. It runs in the caller's goroutine, beside a started loop
// or without one.
func (r *Relay) Flush(ctx context.Context) error {
	for {
		n, _, err := r.publishBatch(ctx, true)
		if err != nil {
			return err
		}
		if n < r.config.BatchSize {
			return nil
		}
	}
}

func (r *Relay) run(ctx context.Context) {
	defer r.finalFlush(ctx)

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failures := 0
	nudged := false
	for {
		if ctx.Err() != nil {
			return
		}
		// A nudge sent before this pass starts is covered by it: the pass
		// reads rows committed up to its SELECT.
		select {
		case <-r.nudge:
			nudged = true
		default:
		}
		n, locked, err := r.publishBatch(ctx, false)
		if err == nil && !locked && nudged {
			// Another relay's pass holds the lock, and rows committed here
			// may have missed its SELECT: wait for the lock (bounded by
			// the connection's lock_timeout) rather than for the poll.
			n, locked, err = r.publishBatch(ctx, true)
		}
		nudged = false
		var wait time.Duration
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			wait = min(retryBackoffMax, retryBackoffMin<<min(failures, 6))
			failures++
			r.logger.WarnContext(ctx, "outbox relay: publish failed; rows stay unpublished and will be retried",
				slog.Any("error", err), slog.Duration("retry_in", wait), slog.Int("failures", failures))
		case locked && n == r.config.BatchSize:
			failures = 0
			continue
		default:
			failures = 0
			wait = r.config.PollInterval
		}
		timer.Reset(wait)
		if err == nil && r.idleSignal != nil {
			select {
			case r.idleSignal <- struct{}{}:
			default:
			}
		}
		if err != nil {
			// Backing off: nudges stay pending (they are coalesced) and are
			// served by the pass after the backoff.
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-r.nudge:
			nudged = true
			// Since Go 1.23 a stopped timer never delivers a stale tick,
			// so the next Reset needs no drain.
			timer.Stop()
		case <-timer.C:
		}
	}
}

// finalFlush is the last pass of a stopping loop, on a context that is not
// cancelled with the loop's but is bounded.
func (r *Relay) finalFlush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopFlushTimeout)
	defer cancel()
	if err := r.Flush(ctx); err != nil {
		r.logger.WarnContext(ctx, "outbox relay: last pass before stopping failed; rows stay for the next relay",
			slog.Any("error", err))
	}
}

// publishBatch runs one pass. With wait it blocks on RelayLockKey, else it
// gives up when another transaction holds it (locked is false). It returns
// the number of rows published.
func (r *Relay) publishBatch(ctx context.Context, wait bool) (n int, locked bool, err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outbox relay: beginning publish transaction: %w", err)
	}
	// After Commit this is a no-op; on any failure it releases the lock
	// and leaves the rows unpublished, even when ctx is already cancelled.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if wait {
		_, err = tx.Exec(ctx, lockSQL, RelayLockKey)
		locked = err == nil
	} else {
		err = tx.QueryRow(ctx, tryLockSQL, RelayLockKey).Scan(&locked)
	}
	if err != nil {
		return 0, false, fmt.Errorf("outbox relay: taking advisory lock %d: %w", RelayLockKey, err)
	}
	if !locked {
		return 0, false, nil
	}

	rows, err := tx.Query(ctx, selectSQL, r.config.BatchSize)
	if err != nil {
		return 0, true, fmt.Errorf("outbox relay: selecting unpublished rows: %w", err)
	}
	var (
		ids  []int64
		msgs []*sarama.ProducerMessage
	)
	var (
		id         int64
		topic, key string
		payload    []byte
	)
	quarantine := map[int64]string{}
	_, err = pgx.ForEachRow(rows, []any{&id, &topic, &key, &payload}, func() error {
		if size := len(payload) + len(key) + len(HeaderOutboxID) + 64; size > r.maxMessageBytes() {
			quarantine[id] = fmt.Sprintf("message of about %d bytes exceeds the producer's limit of %d", size, r.maxMessageBytes())
			return nil
		}
		ids = append(ids, id)
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: topic,
			Key:   sarama.StringEncoder(key),
			Value: sarama.ByteEncoder(payload),
			Headers: []sarama.RecordHeader{
				{Key: []byte(HeaderOutboxID), Value: strconv.AppendInt(nil, id, 10)},
			},
			Metadata: id,
		})
		return nil
	})
	if err != nil {
		return 0, true, fmt.Errorf("outbox relay: reading unpublished rows: %w", err)
	}
	if len(ids) == 0 && len(quarantine) == 0 {
		return 0, true, nil
	}

	// One call, in ID order: the producer keeps the order of messages of
	// one partition, and a key always maps to one partition.
	if len(msgs) > 0 {
		if err := r.producer.SendMessages(msgs); err != nil {
			// Messages the broker refuses for good are quarantined, and the
			// others of the batch, which were sent, are marked; anything
			// else leaves the whole batch for the next pass.
			var perrs sarama.ProducerErrors
			if !errors.As(err, &perrs) || !allPermanent(perrs) {
				return 0, true, fmt.Errorf("outbox relay: publishing %d rows (ids %d..%d): %w", len(ids), ids[0], ids[len(ids)-1], err)
			}
			failed := map[int64]bool{}
			for _, pe := range perrs {
				if fid, ok := pe.Msg.Metadata.(int64); ok {
					failed[fid] = true
					quarantine[fid] = "refused by the producer or the broker: " + pe.Err.Error()
				}
			}
			ids = slices.DeleteFunc(ids, func(id int64) bool { return failed[id] })
		}
	}
	faults.Hit(faults.RelayAfterPublish)

	// The rows are in Kafka now: finish marking them even if ctx was
	// cancelled meanwhile (Stop), or the last pass would send them again.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	var oldestSeconds float64
	if err := tx.QueryRow(ctx, markSQL, ids).Scan(&oldestSeconds); err != nil {
		return 0, true, fmt.Errorf("outbox relay: marking %d published rows: %w", len(ids), err)
	}
	for qid, reason := range quarantine {
		if _, err := tx.Exec(ctx, quarantineSQL, qid, reason); err != nil {
			return 0, true, fmt.Errorf("outbox relay: quarantining row %d: %w", qid, err)
		}
		r.config.Logger.Warn("outbox row quarantined; the rows behind it go on", slog.Int64("outbox_id", qid), slog.String("reason", reason))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, true, fmt.Errorf("outbox relay: committing %d published rows: %w", len(ids), err)
	}
	if r.config.OnPublished != nil {
		r.config.OnPublished(len(ids), time.Duration(oldestSeconds*float64(time.Second)))
	}
	return len(ids), true, nil
}

// maxMessageBytes is RelayConfig.MaxMessageBytes with its default.
func (r *Relay) maxMessageBytes() int { return cmp.Or(r.config.MaxMessageBytes, 1_000_000) }

// allPermanent reports whether every failure is one that no retry fixes.
func allPermanent(perrs sarama.ProducerErrors) bool {
	for _, pe := range perrs {
		// Sarama refuses an oversize message itself with a ConfigurationError
		// (its own limit), the broker with ErrMessageSizeTooLarge (its limit).
		var ce sarama.ConfigurationError
		if !errors.As(pe.Err, &ce) && !errors.Is(pe.Err, sarama.ErrMessageSizeTooLarge) &&
			!errors.Is(pe.Err, sarama.ErrInvalidMessage) && !errors.Is(pe.Err, sarama.ErrInvalidMessageSize) {
			return false
		}
	}
	return len(perrs) > 0
}

const (
	quarantineSQL = `UPDATE outbox SET quarantine_reason = $2, quarantined_at = now() WHERE id = $1 AND published_at IS NULL`
	lockSQL       = `SELECT pg_advisory_xact_lock($1)`
	tryLockSQL    = `SELECT pg_try_advisory_xact_lock($1)`
	// Served by the partial index outbox_unpublished.
	selectSQL = `
SELECT id, topic, key, payload FROM outbox
WHERE published_at IS NULL AND quarantine_reason IS NULL
ORDER BY id
LIMIT $1`
	// now() is this transaction's start, the same for the whole batch; the
	// age reported to OnPublished uses the clock at marking time.
	markSQL = `
WITH marked AS (
    UPDATE outbox SET published_at = now()
    WHERE id = ANY($1) AND published_at IS NULL
    RETURNING created_at
)
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 FROM marked`
)
