package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/eapache/go-resiliency/breaker"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/startstop"
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
// It is no watermark: the rows of one key may reach Kafka out of ID order
// (see Relay), so a lower ID after a higher one is not a repeat.
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
	markTimeout = 5 * time.Second
	// failingRowQuarantineAfterDefault gives an operator time to create a
	// missing topic or restore an ACL before the rows waiting for it are
	// set aside; the later rows of their keys wait that long at most.
	failingRowQuarantineAfterDefault = 2 * time.Minute
	failingRowMinPasses              = 3
	retryBackoffMin                  = 100 * time.Millisecond
	retryBackoffMax                  = 5 * time.Second
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
	// start of the transaction that wrote it to its marking; a row whose
	// created_at is not a time has none, and 0 when no row has one), for
	// metrics.
	// It may be called from the loop and from Flush at once. Defaults to
	// nil (not called).
	OnPublished func(n int, oldest time.Duration)
	// FailingRowQuarantineAfter is how long a row Kafka keeps refusing
	// with an error that is neither about its size nor about the cluster
	// or the connection (a topic that does not exist, an ACL revoked on one
	// topic, CORRUPT_MESSAGE) is retried before it is quarantined: it must
	// have failed on at least 3 passes and for this long, as seen by one
	// relay. Meanwhile only the later rows of its key wait behind it. Once
	// a topic has refused rows so (on 3 passes over this long, none of its
	// rows delivered), a new row for it is quarantined at its first
	// refusal, so that a missing topic costs each key one window, not one
	// per row. Errors about the cluster or the connection (no broker, no
	// leader, timeouts) never quarantine a row. Defaults to 2 minutes.
	FailingRowQuarantineAfter time.Duration
	// MaxMessageBytes is the largest message the producer sends (Sarama's
	// Producer.MaxMessageBytes). A row that cannot fit is quarantined, not
	// sent: it would fail every pass and block the rows behind it.
	// Defaults to 1,000,000, Sarama's default.
	MaxMessageBytes int
	// MaxPassBytes bounds the payloads one pass holds and sends: the pass
	// ends at the row that reaches it (it takes one row at least), and the
	// next pass follows at once. A row may be as large as MaxMessageBytes,
	// and a pass held BatchSize of them at once: 500 events of a large
	// answer each (a backlog after an outage of Kafka) were up to 500 MB
	// of rows in one relay, and the next relay to take the lock took the
	// same rows. Defaults to 16 MiB.
	MaxPassBytes int
	// RoundTripTimeout bounds a pass's database work before the send (its
	// transaction's start, the advisory lock, the select) and its
	// rollback: the loop's context has no deadline, and a connection gone
	// silent (a partition, a failover with no reset) would otherwise hold
	// the relay, and every row it should publish (the wakes among them),
	// until the kernel gave up (about 15 minutes). Past it the connection
	// is closed and the loop backs off and tries again on another.
	// Defaults to pgdb.RoundTripTimeoutDefault.
	RoundTripTimeout time.Duration
}

// Relay publishes committed outbox rows to Kafka, at least once and in
// order per key, and marks them published.
//
// Each pass is one transaction: take RelayLockKey, select the oldest
// unpublished rows by ID, send them in one SendMessages call, mark them,
// commit. A crash between the send and the commit publishes the batch
// again: a harmless duplicate (docs/design.md, crash window
// "outbox-published"). When the pass's transaction fails after the send
// (the server ended it during a slow send, a lost connection), the rows
// Kafka took are marked in a transaction of their own, so that a relay
// whose sends outlast its transactions still makes progress.
//
// A pass marks what Kafka took even when it refused some rows: a refused
// row, and the later rows of its key (order per key), stay for the next
// pass; on the passes after, the later rows are not sent again until the
// refused one is settled. A row refused for size is quarantined once it
// fails alone (see send); one refused for another reason of its own is
// quarantined after RelayConfig.FailingRowQuarantineAfter; cluster and
// connection errors never quarantine anything. A pass that settles no row
// rolls back and returns its error.
//
// Rows are found by "published_at IS NULL" (a partial index), never by an
// ID cursor: identity values are taken at insert, transactions commit in
// another order, and a cursor past a later ID would skip an earlier one
// that commits afterwards. Order per key is ID order among the rows each
// pass sees, and a pass does not wait for a lower ID still in flight.
// Writers of one key do not all serialise: admission locks the session
// row, but the executor's writes that cannot release its claim (a later
// turn's first step, promptline_turn_next; a step with tool calls; a tool
// call's intent and result; a permission ask) open with the fence alone,
// so an admission may take the next ID and commit first. Such rows go out
// in commit order when a pass comes between the two commits, in ID order
// when none does. Neither row can tell of the other's transaction (the
// lower was written before the higher committed, the higher committed
// before the lower did), so either order is a true history; and a row
// written after another row of its key committed has the higher ID and is
// never visible without it, so it is published after it
// (TestSessionEventsOfOverlappingWrites, in ledger).
type Relay struct {
	pool     *pgxpool.Pool
	producer sarama.SyncProducer
	config   RelayConfig
	logger   *slog.Logger
	nudge    chan struct{}

	// failMu guards failing, the rows refused on earlier passes of this
	// relay (by ID), and suspectKeys, the keys whose first unpublished row
	// is one of them. Passes of the loop and of Flush may run at once.
	failMu      sync.Mutex
	failing     map[int64]*failingRow
	suspectKeys map[string]struct{}
	// topics holds, per topic, the streak of passes on which its rows
	// failed by their own fault and none was delivered: once a topic has
	// refused rows for the whole window, a new row for it is quarantined
	// at its first refusal.
	topics map[string]*failingRow
	// deliveries counts the messages this relay's producer delivered: the
	// evidence that Kafka is up when an error does not say whose fault it
	// is.
	deliveries int64
	// topicDeliveries is, per topic, deliveries when a row of the topic
	// was last delivered.
	topicDeliveries map[string]int64
	// deferred are the failing rows the current pass left for a later
	// one (their keys stay suspect), and failCursor the highest ID of a
	// failing row tried by the last pass that deferred some: see
	// publishBatch.
	deferred   map[int64]bool
	failCursor int64

	loop startstop.Loop

	// idleSignal, when set (by tests in this package), receives a value
	// each time the loop settles into waiting for a nudge or the poll timer,
	// so that tests can wait on the loop instead of sleeping.
	idleSignal chan struct{}
	// now is the clock of the quarantine windows: time.Now, or a test's.
	now func() time.Time
	// afterSend, when set (by tests in this package), runs after each
	// pass's send, before its rows are marked.
	afterSend func()
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
	c.FailingRowQuarantineAfter = cmp.Or(c.FailingRowQuarantineAfter, failingRowQuarantineAfterDefault)
	c.MaxPassBytes = cmp.Or(c.MaxPassBytes, maxPassBytesDefault)
	c.RoundTripTimeout = cmp.Or(c.RoundTripTimeout, pgdb.RoundTripTimeoutDefault)
	return &Relay{
		pool:            pool,
		producer:        producer,
		config:          c,
		logger:          c.Logger,
		nudge:           make(chan struct{}, 1),
		failing:         map[int64]*failingRow{},
		suspectKeys:     map[string]struct{}{},
		topics:          map[string]*failingRow{},
		topicDeliveries: map[string]int64{},
		now:             time.Now,
	}
}

// Start runs the relay loop in a goroutine until ctx is done or Stop is
// called, and returns at once; it fails while the loop runs. A stopped
// relay may be started again.
func (r *Relay) Start(ctx context.Context) error {
	if err := r.loop.Start(ctx, r.run); err != nil {
		return fmt.Errorf("starting outbox relay: %w", err)
	}
	return nil
}

// Stop ends the loop and waits for it. Before exiting, the loop makes one
// last pass over what is committed (bounded by 5s) so that a graceful
// shutdown leaves nothing for the next process. That pass comes when the
// loop ends: if Start's ctx ended first, it came then, and a later Stop
// publishes nothing committed since. A process that commits rows after
// its signal (turns finishing within the shutdown grace) starts the relay
// with context.WithoutCancel, so that Stop's pass sees them. Stop may be
// called twice, and before Start.
func (r *Relay) Stop() { r.loop.Stop() }

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
// when a pass finds less than a full batch (of rows or of bytes); rows
// that fail for what they are (a topic that refuses them: the relay's
// failing rows, tried again by later passes, or quarantined) are left,
// and Flush returns nil all the same. Unlike the loop it waits for
// RelayLockKey instead of giving up, so it also waits out a pass running in
// another relay. It runs in the caller's goroutine, beside a started loop
// or without one.
func (r *Relay) Flush(ctx context.Context) error {
	for {
		_, _, more, err := r.publishBatch(ctx, true)
		if err != nil {
			return err
		}
		if !more {
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
		_, locked, more, err := r.publishBatch(ctx, false)
		if err == nil && !locked && nudged {
			// Another relay's pass holds the lock, and rows committed here
			// may have missed its SELECT: wait for the lock (bounded by
			// the connection's lock_timeout) rather than for the poll.
			_, locked, more, err = r.publishBatch(ctx, true)
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
		case locked && more:
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
// the number of rows published, and more when rows may be left behind
// the pass: it published a full batch, or it ended at MaxPassBytes.
func (r *Relay) publishBatch(ctx context.Context, wait bool) (n int, locked, more bool, err error) {
	// The reads before the send are bounded (RoundTripTimeout), whatever
	// ctx's deadline: their deadline ending closes the connection.
	rctx, rcancel := context.WithTimeout(ctx, r.config.RoundTripTimeout)
	defer rcancel()
	tx, err := r.pool.Begin(rctx)
	if err != nil {
		return 0, false, false, fmt.Errorf("outbox relay: beginning publish transaction: %w", err)
	}
	// After Commit this is a no-op; on any failure it releases the lock
	// and leaves the rows unpublished, even when ctx is already cancelled.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.config.RoundTripTimeout)
		defer cancel()
		_ = tx.Rollback(ctx)
	}()

	if wait {
		_, err = tx.Exec(rctx, lockSQL, RelayLockKey)
		locked = err == nil
	} else {
		err = tx.QueryRow(rctx, tryLockSQL, RelayLockKey).Scan(&locked, nil, nil)
	}
	if err != nil {
		return 0, false, false, fmt.Errorf("outbox relay: taking advisory lock %d: %w", RelayLockKey, err)
	}
	if !locked {
		return 0, false, false, nil
	}

	failingIDs, suspectKeys, cursor := r.failingSnapshot()
	isFailing := make(map[int64]bool, len(failingIDs))
	for _, id := range failingIDs {
		isFailing[id] = true
	}
	rows, err := tx.Query(rctx, selectSQL, r.config.BatchSize, failingIDs, suspectKeys)
	if err != nil {
		return 0, true, false, fmt.Errorf("outbox relay: selecting unpublished rows: %w", err)
	}
	var (
		pass       []passRow
		id         int64
		topic, key string
		payload    []byte
	)
	quarantine := map[int64]string{}
	// cut: the pass ended at MaxPassBytes; the rows after it, in ID order,
	// wait for the next pass, which follows at once.
	var passBytes int
	cut := false
	// The rows Kafka refused on the last pass come first (the oldest
	// unpublished rows), one per key. Kept below half of MaxPassBytes,
	// they leave the other keys room in every pass: a partition without
	// a leader refusing rows that alone reach MaxPassBytes would
	// otherwise hold back every session's events and wakes for as long
	// as it lasts. The ones left out (deferred; their keys still wait on
	// them) go first on later passes: a pass that deferred some skips, on
	// the next, the failing rows up to the highest one it tried, until
	// none is left beyond it.
	var (
		failingBytes, failingTried int
		lastTried                  int64
		deferred                   = map[int64]bool{}
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &topic, &key, &payload}, func() error {
		if size := messageBytes(key, len(payload)); size > r.maxMessageBytes() {
			quarantine[id] = fmt.Sprintf("message of about %d bytes exceeds the producer's limit of %d", size, r.maxMessageBytes())
			return nil
		}
		if isFailing[id] {
			if id <= cursor || (failingTried > 0 && failingBytes+len(payload) > r.config.MaxPassBytes/2) {
				deferred[id] = true
				return nil
			}
			failingTried++
			failingBytes += len(payload)
			lastTried = id
		}
		// pgx scans a bytea into a new slice each row (it copies out of
		// its read buffer), so payload is the row's own: no clone, which
		// held every pass's rows twice.
		pass = append(pass, passRow{id: id, topic: topic, key: key, payload: payload})
		if passBytes += len(payload); passBytes >= r.config.MaxPassBytes {
			cut = true
			return errPassFull
		}
		return nil
	})
	if errors.Is(err, errPassFull) {
		err = nil
	}
	if err != nil {
		return 0, true, false, fmt.Errorf("outbox relay: reading unpublished rows: %w", err)
	}
	r.failMu.Lock()
	r.deferred = deferred
	switch {
	case len(deferred) == 0:
		r.failCursor = 0
	case failingTried == 0:
		r.failCursor = 0 // every failing row had its turn: start again
	default:
		r.failCursor = lastTried
	}
	r.failMu.Unlock()
	if len(pass) == 0 && len(quarantine) == 0 {
		// Rows this relay remembers as failing and did not see are gone
		// (published or quarantined by another relay): forgotten here
		// too, or their keys would be left out of every later pass.
		r.failMu.Lock()
		r.forgetUnseen(nil, nil)
		r.failMu.Unlock()
		return 0, true, false, nil
	}

	ids, held, failed := r.send(pass, quarantine)
	faults.Hit(faults.RelayAfterPublish)
	if r.afterSend != nil {
		r.afterSend()
	}
	if len(ids) == 0 && len(quarantine) == 0 {
		// Nothing went out and nothing is settled: the loop backs off.
		return 0, true, false, fmt.Errorf("outbox relay: publishing %d rows (ids %d..%d): %w",
			len(pass), pass[0].id, pass[len(pass)-1].id, failed)
	}
	if held > 0 {
		r.logger.WarnContext(ctx, "outbox relay: rows refused; they and the later rows of their keys are retried, the rest are marked",
			slog.Int("held", held), slog.Int("published", len(ids)), slog.Any("error", failed))
	}

	// The rows are in Kafka now: finish marking them even if ctx was
	// cancelled meanwhile (Stop), or the last pass would send them again.
	parent := context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(parent, markTimeout)
	defer cancel()
	oldestSeconds, err := settle(ctx, tx, ids, quarantine)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		// The pass's transaction failed after the send: the server may
		// have ended it (a send that outlasted its idle-in-transaction
		// timeout), or a statement or the commit failed. What Kafka took
		// is there all the same, so the marks go again in a transaction
		// of their own. Without the lock: a relay that took it meanwhile
		// may send those rows once more, in order, a harmless duplicate;
		// not marked, every later pass would send them again, and a send
		// as slow would never mark them.
		// A deadline of its own: the first try may have spent all of its.
		_ = tx.Rollback(ctx)
		r.config.Logger.Warn("outbox relay: marking in the pass's transaction failed; marking in a transaction of its own",
			slog.Int("published", len(ids)), slog.Any("error", err))
		ctx, cancel := context.WithTimeout(parent, markTimeout)
		defer cancel()
		err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) (err error) {
			if _, err := tx.Exec(ctx, settleSettingsSQL); err != nil {
				return fmt.Errorf("setting the pass's plan settings: %w", err)
			}
			oldestSeconds, err = settle(ctx, tx, ids, quarantine)
			return err
		})
		if err != nil {
			return 0, true, false, fmt.Errorf("outbox relay: %w", err)
		}
	}
	for qid, reason := range quarantine {
		r.config.Logger.Warn("outbox row quarantined; the rows behind it go on", slog.Int64("outbox_id", qid), slog.String("reason", reason))
	}
	for qid := range quarantine {
		r.forget(qid)
	}
	if r.config.OnPublished != nil && len(ids) > 0 {
		r.config.OnPublished(len(ids), time.Duration(oldestSeconds*float64(time.Second)))
	}
	return len(ids), true, cut || len(ids) == r.config.BatchSize, nil
}

// settle marks the rows Kafka took published and quarantines the rows
// that can never be sent, in tx; it returns the age of the oldest row
// marked (OnPublished). Both statements skip rows already published, so
// settling twice changes nothing.
func settle(ctx context.Context, tx pgx.Tx, ids []int64, quarantine map[int64]string) (oldestSeconds float64, err error) {
	if err := tx.QueryRow(ctx, markSQL, ids).Scan(&oldestSeconds); err != nil {
		return 0, fmt.Errorf("marking %d published rows: %w", len(ids), err)
	}
	for qid, reason := range quarantine {
		if _, err := tx.Exec(ctx, quarantineSQL, qid, reason); err != nil {
			return 0, fmt.Errorf("quarantining row %d: %w", qid, err)
		}
	}
	return oldestSeconds, nil
}

// passRow is one selected row of a pass.
type passRow struct {
	id         int64
	topic, key string
	payload    []byte
}

func (p passRow) message() *sarama.ProducerMessage {
	return &sarama.ProducerMessage{
		Topic: p.topic,
		Key:   sarama.StringEncoder(p.key),
		Value: sarama.ByteEncoder(p.payload),
		Headers: []sarama.RecordHeader{
			{Key: []byte(HeaderOutboxID), Value: strconv.AppendInt(nil, p.id, 10)},
		},
		Metadata: p.id,
	}
}

// failingRow is what a relay remembers of a row Kafka refused on its
// earlier passes.
type failingRow struct {
	key    string
	since  time.Time
	passes int
	// deliveries is Relay.deliveries when the row last failed, and
	// topicDeliveries Relay.topicDeliveries of its topic.
	deliveries, topicDeliveries int64
	// last is when a topic's streak was last extended.
	last time.Time
}

// send publishes the rows of a pass and sorts them: ids were delivered and
// are to be marked; rows refused for good are added to quarantine; the
// other refused rows, and the later rows of their keys, are held (left
// unpublished for the next pass, so that a key's rows reach Kafka in ID
// order). failed is one of the errors of the held rows.
//
// Kafka reports errors per partition set: one message over a topic's
// max.message.bytes makes the broker refuse every message batched with
// it. Rows refused for size are therefore sent again one by one, and only
// a row refused alone is quarantined.
func (r *Relay) send(pass []passRow, quarantine map[int64]string) (ids []int64, held int, failed error) {
	// A key whose first row in this pass failed on the previous pass sends
	// only that row: its later rows wait for the outcome instead of being
	// sent again (as duplicates) on every pass while it fails. (selectSQL
	// already leaves them out; this keeps send right on its own.)
	r.failMu.Lock()
	seen := map[string]bool{}
	var msgs []*sarama.ProducerMessage
	for _, p := range pass {
		if _, suspect := r.suspectKeys[p.key]; suspect && seen[p.key] {
			continue
		}
		seen[p.key] = true
		msgs = append(msgs, p.message())
	}
	r.failMu.Unlock()

	outcome := make(map[int64]error, len(pass))
	sent := make(map[int64]bool, len(msgs))
	for _, m := range msgs {
		sent[m.Metadata.(int64)] = true
	}
	if len(msgs) > 0 {
		r.produce(msgs, outcome)
	}

	// Split what the broker refused for size.
	var bySize []passRow
	for _, p := range pass {
		if err, ok := outcome[p.id]; ok && sizeError(err) {
			bySize = append(bySize, p)
		}
	}
	// alone marks the rows whose outcome is that of a send by themselves.
	alone := map[int64]bool{}
	if len(bySize) == 1 {
		alone[bySize[0].id] = true
	}
	if len(bySize) > 1 {
		blocked := map[string]bool{}
		for _, p := range pass {
			if !sent[p.id] {
				continue
			}
			err := outcome[p.id]
			if blocked[p.key] {
				continue
			}
			if err != nil && !sizeError(err) {
				blocked[p.key] = true
				continue
			}
			if err == nil {
				continue
			}
			_, _, err = r.producer.SendMessage(p.message())
			outcome[p.id] = err
			alone[p.id] = true
			if err != nil && !permanent(err) {
				blocked[p.key] = true
			}
		}
	}

	now := r.now()
	r.failMu.Lock()
	defer r.failMu.Unlock()
	before := r.deliveries
	for _, err := range outcome {
		if err == nil {
			r.deliveries++
		}
	}
	// A topic Kafka took a row for is not refusing rows.
	for _, p := range pass {
		if err, ok := outcome[p.id]; ok && err == nil {
			delete(r.topics, p.topic)
			r.topicDeliveries[p.topic] = r.deliveries
		}
	}
	counted := map[string]bool{} // topics whose streak this pass extended
	blocked := map[string]bool{}
	selected := make(map[int64]bool, len(pass))
	for _, p := range pass {
		selected[p.id] = true
		if blocked[p.key] || !sent[p.id] {
			held++
			blocked[p.key] = true
			continue
		}
		err := outcome[p.id]
		switch {
		case err == nil:
			ids = append(ids, p.id)
			delete(r.failing, p.id)
		case permanent(err) && alone[p.id]:
			quarantine[p.id] = "refused by the producer or the broker: " + err.Error()
		case sizeError(err):
			// Refused with its set and not yet sent alone (an earlier row
			// of its key failed): the next pass tells.
			failed = err
			held++
			blocked[p.key] = true
		default:
			failed = err
			f := r.failing[p.id]
			if f == nil || f.key != p.key {
				f = &failingRow{key: p.key, since: now, deliveries: before}
				r.failing[p.id] = f
			}
			fault := rowsFault(err, r.deliveries > f.deliveries, r.topicDeliveries[p.topic] > f.topicDeliveries)
			if fault {
				f.passes++
			}
			f.deliveries, f.topicDeliveries = r.deliveries, r.topicDeliveries[p.topic]
			after := r.config.FailingRowQuarantineAfter
			ts := r.topics[p.topic]
			if fault && !counted[p.topic] {
				counted[p.topic] = true
				if ts == nil || now.Sub(ts.last) > after {
					// A streak with a window's gap in it is over.
					ts = &failingRow{since: now}
					r.topics[p.topic] = ts
				}
				ts.passes++
				ts.last = now
			}
			switch {
			case f.passes >= failingRowMinPasses && now.Sub(f.since) >= after:
				quarantine[p.id] = fmt.Sprintf("refused by the producer or the broker on %d passes over %s (topic %s): %s",
					f.passes, now.Sub(f.since).Round(time.Millisecond), p.topic, err)
				continue
			case fault && ts != nil && ts.passes >= failingRowMinPasses && now.Sub(ts.since) >= after:
				quarantine[p.id] = fmt.Sprintf("refused by the producer or the broker (topic %s has refused rows on %d passes over %s): %s",
					p.topic, ts.passes, now.Sub(ts.since).Round(time.Millisecond), err)
				continue
			}
			held++
			blocked[p.key] = true
		}
	}
	r.forgetUnseen(selected, quarantine)
	if failed == nil && held > 0 {
		failed = errors.New("an earlier row of the same key was refused")
	}
	return ids, held, failed
}

// produce sends msgs in one call, in ID order (the producer keeps the
// order of messages of one partition, and a key always maps to one
// partition), and records each message's error in outcome (nil when
// delivered).
func (r *Relay) produce(msgs []*sarama.ProducerMessage, outcome map[int64]error) {
	for _, m := range msgs {
		outcome[m.Metadata.(int64)] = nil
	}
	err := r.producer.SendMessages(msgs)
	if err == nil {
		return
	}
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		// The producer refused the whole call (closed, say): nothing was
		// delivered as far as we know.
		for _, m := range msgs {
			outcome[m.Metadata.(int64)] = err
		}
		return
	}
	for _, pe := range perrs {
		if fid, ok := pe.Msg.Metadata.(int64); ok {
			outcome[fid] = pe.Err
		}
	}
}

// forgetUnseen forgets the failing rows the pass neither selected nor
// deferred (published or quarantined by another relay), and remembers
// which keys wait on a failing row: every one not quarantined now. The
// caller holds failMu.
func (r *Relay) forgetUnseen(selected map[int64]bool, quarantine map[int64]string) {
	clear(r.suspectKeys)
	for fid, f := range r.failing {
		if !selected[fid] && !r.deferred[fid] {
			delete(r.failing, fid)
			continue
		}
		if _, q := quarantine[fid]; !q {
			r.suspectKeys[f.key] = struct{}{}
		}
	}
}

// failingSnapshot returns the rows that failed on the last pass of this
// relay and their keys, for selectSQL, and failCursor.
func (r *Relay) failingSnapshot() (ids []int64, keys []string, cursor int64) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	ids = make([]int64, 0, len(r.failing))
	for id := range r.failing {
		ids = append(ids, id)
	}
	keys = make([]string, 0, len(r.suspectKeys))
	for k := range r.suspectKeys {
		keys = append(keys, k)
	}
	return ids, keys, r.failCursor
}

// forget drops what the relay remembers of row id.
func (r *Relay) forget(id int64) {
	r.failMu.Lock()
	defer r.failMu.Unlock()
	delete(r.failing, id)
}

// maxMessageBytes is RelayConfig.MaxMessageBytes with its default.
func (r *Relay) maxMessageBytes() int {
	return cmp.Or(r.config.MaxMessageBytes, maxMessageBytesDefault)
}

// maxMessageBytesDefault is RelayConfig.MaxMessageBytes when it is zero:
// Sarama's default.
const maxMessageBytesDefault = 1_000_000

// maxPassBytesDefault is RelayConfig.MaxPassBytes when it is zero.
const maxPassBytesDefault = 16 << 20

// errPassFull ends the reading of a pass's rows at MaxPassBytes.
var errPassFull = errors.New("the pass holds MaxPassBytes")

// sizeError reports whether err says the message, or the produce set it
// was batched in, is over a limit: the broker refuses the whole set, so a
// set is split before anything in it is quarantined.
func sizeError(err error) bool {
	var ce sarama.ConfigurationError
	return errors.As(err, &ce) || errors.Is(err, sarama.ErrMessageSizeTooLarge) ||
		errors.Is(err, sarama.ErrInvalidMessageSize) || errors.Is(err, sarama.ErrMessageSetSizeTooLarge)
}

// permanent reports whether err, for a message sent alone, is one no retry
// fixes. Sarama refuses an oversize message itself with a
// ConfigurationError (its own limit, checked per message); the broker
// answers ErrMessageSizeTooLarge (the topic's limit, for the whole set).
// ErrInvalidMessage (CORRUPT_MESSAGE) is not among them: Sarama retries it.
func permanent(err error) bool {
	return sizeError(err)
}

// transient reports whether err is about the cluster or the connection,
// not the row: such failures are retried for as long as they last and never
// count toward quarantining a row (docs/design.md, invariant 13).
func transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	for _, t := range transientErrors {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// rowsFault reports whether a failure of a row counts toward quarantining
// it: not when it is about the cluster or the connection; yes when a broker
// answered with an error of its own (a topic that does not exist, an ACL);
// for Sarama's open breaker, only when other messages were delivered and
// none of the row's topic; for any other error, which says nothing about
// why, only when this relay delivered other messages since the row last
// failed, so Kafka was up meanwhile.
//
// The breaker of a partition's producer opens after three failed leader
// lookups of that partition: for a topic that does not exist (the row's
// fault: no partition of its topic delivers), and for a partition without
// a leader while the topic's others have one (a fault of the cluster,
// which must never set a row aside: its topic's other rows deliver). A
// topic whose only partition in use has no leader still reads as the
// row's fault.
func rowsFault(err error, othersDelivered, topicDelivered bool) bool {
	if transient(err) {
		return false
	}
	var ke sarama.KError
	if errors.As(err, &ke) {
		return true
	}
	if errors.Is(err, breaker.ErrBreakerOpen) {
		return othersDelivered && !topicDelivered
	}
	return othersDelivered
}

var transientErrors = []error{
	sarama.ErrOutOfBrokers, sarama.ErrNotConnected, sarama.ErrClosedClient, sarama.ErrShuttingDown,
	sarama.ErrIncompleteResponse, sarama.ErrProducerRetryBufferOverflow,
	sarama.ErrLeaderNotAvailable, sarama.ErrNotLeaderForPartition, sarama.ErrRequestTimedOut,
	sarama.ErrBrokerNotAvailable, sarama.ErrReplicaNotAvailable, sarama.ErrNetworkException,
	sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrKafkaStorageError,
	sarama.ErrNotController, sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch,
	sarama.ErrOutOfOrderSequenceNumber, sarama.ErrDuplicateSequenceNumber, sarama.ErrInvalidProducerEpoch,
	sarama.ErrUnknownProducerID, sarama.ErrConcurrentTransactions, sarama.ErrThrottlingQuotaExceeded,
	sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrNotCoordinatorForConsumer,
}

const (
	quarantineSQL = `UPDATE outbox SET quarantine_reason = $2, quarantined_at = now() WHERE id = $1 AND published_at IS NULL`
	// The pass's lock also turns bitmap scans off for the pass's
	// transaction (set_config's true: SET LOCAL), for selectSQL. After a
	// burst of marks the table's statistics lag, the planner expects a few
	// unpublished rows and picks a bitmap scan of outbox_unpublished and a
	// sort; a bitmap scan never marks the index entries of marked rows
	// dead, so every pass read every such entry and its heap page again
	// until a vacuum: 15 ms a pass on the burn-down bench, 0.16 ms of
	// Postgres time per turn. An ordered index scan marks them dead as it
	// passes them (kill_prior_tuple) and stops at the batch's end: 0.4-1.0
	// ms against 3.7-7.5 ms a pass over 100,000 marked rows
	// (docs/benchmarks.md, TestSelectIsAnOrderedIndexScan).
	//
	// It turns sequential scans off as well, for selectSQL and markSQL:
	// both are prepared, and the generic plan Postgres keeps for a
	// prepared statement is made once, at the size the table has then. On
	// a fresh database (no analyze yet) a plan made while the outbox held a
	// few dozen rows read the whole table, and was kept as the table grew:
	// 133 passes read 2.3 million rows in the bench's steady phase
	// (docs/benchmarks.md, "A plan made on a small table";
	// TestPassPlansAreIndexScansAtAnySize). Both look rows up by an index
	// at every size.
	lockSQL    = `SELECT pg_advisory_xact_lock($1), ` + passSettings
	tryLockSQL = `SELECT pg_try_advisory_xact_lock($1), ` + passSettings
	// settleSettingsSQL gives a settle in a transaction of its own the
	// pass's settings.
	settleSettingsSQL = `SELECT ` + passSettings
	passSettings      = `set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`
	// Served by the partial index outbox_unpublished. The rows that failed
	// on this relay's last pass ($2, at most one per key: its first), then
	// a batch of the others, leaving out the later rows of those keys ($3),
	// which wait for them: rows Kafka refuses never fill every batch.
	selectSQL = `
(SELECT id, topic, key, payload FROM outbox
 WHERE published_at IS NULL AND quarantine_reason IS NULL AND id = ANY($2::bigint[])
 ORDER BY id LIMIT $1)
UNION ALL
(SELECT id, topic, key, payload FROM outbox
 WHERE published_at IS NULL AND quarantine_reason IS NULL
   AND id <> ALL($2::bigint[]) AND key <> ALL($3::text[])
 ORDER BY id LIMIT $1)
ORDER BY id`
	// now() is this transaction's start, the same for the whole batch; the
	// age reported to OnPublished uses the clock at marking time, of the
	// oldest row whose created_at is a time: the column admits
	// '-infinity' and 'infinity' (a hand edit, a restore), which have no
	// age, and the clock less either is an error that would fail the mark
	// of the whole batch on every pass (invariant 13).
	markSQL = `
WITH marked AS (
    UPDATE outbox SET published_at = now()
    WHERE id = ANY($1) AND published_at IS NULL
    RETURNING created_at
)
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at) FILTER (WHERE isfinite(created_at))), 0)::float8 FROM marked`
)
