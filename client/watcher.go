package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
)

// Start is where a Watcher starts reading each partition. The zero value
// is StartNewest.
type Start struct {
	kind   startKind
	offset int64
	at     time.Time
}

type startKind int

const (
	startNewest startKind = iota
	startOldest
	startOffset
	startTime
)

// StartNewest reads the events published after NewWatcher returned.
func StartNewest() Start { return Start{kind: startNewest} }

// StartOldest reads every event the topic still holds.
func StartOldest() Start { return Start{kind: startOldest} }

// StartAtOffset reads each partition from offset (a session's events are
// all on one partition: with WatchOpts.SessionID it is that partition's
// offset). An offset the partition no longer or not yet holds fails
// NewWatcher.
func StartAtOffset(offset int64) Start { return Start{kind: startOffset, offset: offset} }

// StartAtTime reads each partition from its first event published at or
// after t (by the broker's record timestamps); a partition with none
// starts at its newest offset.
func StartAtTime(t time.Time) Start { return Start{kind: startTime, at: t} }

func (s Start) String() string {
	switch s.kind {
	case startOldest:
		return "the oldest offsets"
	case startOffset:
		return fmt.Sprintf("offset %d", s.offset)
	case startTime:
		return "the offsets at " + s.at.Format(time.RFC3339Nano)
	default:
		return "the newest offsets"
	}
}

const dedupWindowDefault = 100_000

// WatchOpts are what one Watcher follows.
type WatchOpts struct {
	// SessionID, when set, keeps only the events of this session; the
	// Watcher then reads only the partition that holds them (the relay
	// keys events by session ID with murmur2). Defaults to every session.
	SessionID string
	// Types keeps only events of these types (envelope.EventTurnCompleted,
	// ...). Defaults to every type.
	Types []string
	// Start is where each partition is read from. Defaults to
	// StartNewest().
	Start Start
	// DedupWindow is how many of the most recent event IDs are remembered
	// to drop repeats (the relay publishes at least once, and a repeat
	// follows its original closely). Defaults to 100,000.
	DedupWindow int
	// Deltas also reads the live text deltas (Config.DeltasTopic) of the
	// same sessions: NextRecord then returns them too, as Records with
	// Delta set, in the order they arrive beside the events (two topics:
	// no order holds between a delta and an event; docs/session-events.md
	// "Live deltas" says how to combine them). Types does not filter
	// deltas; Next and WaitTurn skip them. With StartAtOffset the deltas
	// topic is read from its newest offsets (an offset is one topic's).
	// Defaults to false: events only.
	Deltas bool
	// ErrorFunc, when set, is told what the Watcher gets past: consumer
	// errors (Sarama retries them) and records that are no session event
	// (a *DecodeError). It runs on the goroutine calling Next. Defaults to
	// none.
	ErrorFunc func(error)
}

// DecodeError is a record of the events topic that is no session event
// (or of the deltas topic that is no delta); the Watcher skips it.
type DecodeError struct {
	Topic     string
	Partition int32
	Offset    int64
	// Delta is set when the record was read from the deltas topic.
	Delta bool
	Err   error
}

func (e *DecodeError) Error() string {
	what := "a session event"
	if e.Delta {
		what = "a delta"
	}
	return fmt.Sprintf("skipping %s/%d/%d: not %s: %v", e.Topic, e.Partition, e.Offset, what, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Watcher follows promptline's session-events topic with plain partition
// consumers: no consumer group, nothing committed. Next returns the
// matching events one by one, repeats of an event ID dropped. Events of
// one session come in the order promptline published them. Close stops
// it. A Watcher is for one goroutine at a time (Close excepted).
type Watcher struct {
	cfg        Config
	opts       WatchOpts
	client     sarama.Client
	consumer   sarama.Consumer
	pcs        []sarama.PartitionConsumer
	partitions []int32
	total      int // partitions of the topic
	deltaParts []int32

	msgs   chan *sarama.ConsumerMessage
	errc   chan error
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	seen  map[string]struct{}
	order []string // ring of the IDs in seen, oldest at next
	next  int
}

// NewWatcher connects and positions a consumer on every partition to
// read (on the session's partition alone with opts.SessionID), so that
// with StartNewest every event published after it returns is seen:
// create the Watcher before sending the prompt whose answer it waits for.
func NewWatcher(config *Config, opts *WatchOpts) (_ *Watcher, err error) {
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &WatchOpts{}
	}
	o := *opts
	o.DedupWindow = cmp.Or(o.DedupWindow, dedupWindowDefault)
	if o.DedupWindow < 0 {
		return nil, fmt.Errorf("client: WatchOpts.DedupWindow: want 0 or more, got %d", opts.DedupWindow)
	}
	if o.SessionID != "" {
		// A filter no session can have would watch for nothing, silently.
		if err := envelope.ValidSessionID(o.SessionID, cfg.Limits); err != nil {
			return nil, fmt.Errorf("client: WatchOpts.SessionID: %w", err)
		}
	}
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{cfg: cfg, opts: o, msgs: make(chan *sarama.ConsumerMessage), errc: make(chan error),
		ctx: ctx, cancel: cancel, seen: make(map[string]struct{}), order: make([]string, 0, min(o.DedupWindow, 1024))}
	defer func() {
		if err != nil {
			_ = w.Close()
		}
	}()
	// Assigned only on success: a failed constructor's nil pointer in an
	// interface field would not compare equal to nil in Close.
	c, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", cfg.EventsTopic, cfg.connectError(err))
	}
	w.client = c
	consumer, err := sarama.NewConsumerFromClient(c)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", cfg.EventsTopic, err)
	}
	w.consumer = consumer
	all, err := w.client.Partitions(cfg.EventsTopic)
	if err != nil {
		return nil, fmt.Errorf("listing the partitions of %s: %w", cfg.EventsTopic, err)
	}
	w.partitions, w.total = all, len(all)
	if o.SessionID != "" {
		w.partitions = []int32{Murmur2Partition([]byte(o.SessionID), int32(len(all)))}
	}
	if err := w.consume(cfg.EventsTopic, w.partitions, o.Start); err != nil {
		return nil, err
	}
	if o.Deltas {
		all, err := w.client.Partitions(cfg.DeltasTopic)
		if err != nil {
			return nil, fmt.Errorf("listing the partitions of %s: %w", cfg.DeltasTopic, err)
		}
		w.deltaParts = all
		if o.SessionID != "" {
			// The deltas publisher keys by session ID with murmur2 too.
			w.deltaParts = []int32{Murmur2Partition([]byte(o.SessionID), int32(len(all)))}
		}
		start := o.Start
		if start.kind == startOffset {
			start = StartNewest()
		}
		if err := w.consume(cfg.DeltasTopic, w.deltaParts, start); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// consume starts a partition consumer and its forwarder for each of
// topic's partitions.
func (w *Watcher) consume(topic string, partitions []int32, start Start) error {
	for _, p := range partitions {
		offset, err := w.startOffset(topic, p, start)
		if err != nil {
			return fmt.Errorf("finding where to start %s/%d at %s: %w", topic, p, start, err)
		}
		// ConsumePartition resolves OffsetNewest now: every event
		// published after NewWatcher returns is seen.
		pc, err := w.consumer.ConsumePartition(topic, p, offset)
		if err != nil {
			return fmt.Errorf("consuming %s/%d from %s: %w", topic, p, start, err)
		}
		w.pcs = append(w.pcs, pc)
		w.wg.Go(func() { w.forward(pc) })
	}
	return nil
}

func (w *Watcher) startOffset(topic string, p int32, start Start) (int64, error) {
	switch start.kind {
	case startOldest:
		return sarama.OffsetOldest, nil
	case startOffset:
		return start.offset, nil
	case startTime:
		off, err := w.client.GetOffset(topic, p, start.at.UnixMilli())
		if err != nil {
			return 0, err
		}
		if off < 0 { // no record at or after the time
			return sarama.OffsetNewest, nil
		}
		return off, nil
	default:
		return sarama.OffsetNewest, nil
	}
}

// Topic is the topic read.
func (w *Watcher) Topic() string { return w.cfg.EventsTopic }

// Partitions are the partitions read.
func (w *Watcher) Partitions() []int32 { return slices.Clone(w.partitions) }

// DeltaPartitions are the partitions of the deltas topic read (none
// without WatchOpts.Deltas).
func (w *Watcher) DeltaPartitions() []int32 { return slices.Clone(w.deltaParts) }

// TopicPartitions is the number of partitions of the topic.
func (w *Watcher) TopicPartitions() int { return w.total }

// Start is where the Watcher started.
func (w *Watcher) Start() Start { return w.opts.Start }

// Next returns the next matching event, waiting for one (deltas are
// skipped). It fails with ctx's error (its cause) when ctx ends, and with
// ErrClosed after Close.
func (w *Watcher) Next(ctx context.Context) (envelope.Event, error) {
	for {
		r, err := w.NextRecord(ctx)
		if err != nil || r.Delta == nil {
			return r.Event, err
		}
	}
}

// Record is a session event, or with WatchOpts.Deltas a live delta, with
// the record that carried it.
type Record struct {
	Event envelope.Event
	// Delta is set (and Event zero) when the record is a live delta.
	Delta *envelope.Delta
	// Value is the record's JSON as published, members this version of
	// envelope.Event (or Delta) does not know included.
	Value     []byte
	Topic     string
	Partition int32
	Offset    int64
}

// NextRecord is Next with the record of the event; with WatchOpts.Deltas
// it returns the deltas too.
func (w *Watcher) NextRecord(ctx context.Context) (Record, error) {
	for {
		select {
		case m := <-w.msgs:
			if w.opts.Deltas && m.Topic == w.cfg.DeltasTopic {
				d, err := envelope.DecodeDelta(m.Value)
				if err != nil {
					w.report(&DecodeError{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Delta: true, Err: err})
					continue
				}
				if d.SessionID == "" {
					d.SessionID = string(m.Key)
				}
				if w.opts.SessionID != "" && d.SessionID != w.opts.SessionID {
					continue
				}
				return Record{Delta: &d, Value: m.Value, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}, nil
			}
			e, err := envelope.DecodeEvent(m.Value)
			if err != nil {
				w.report(&DecodeError{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Err: err})
				continue
			}
			if e.SessionID == "" {
				e.SessionID = string(m.Key)
			}
			if !w.matches(e) || w.repeat(e.ID) {
				continue
			}
			return Record{Event: e, Value: m.Value, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}, nil
		case err := <-w.errc:
			w.report(err)
		case <-ctx.Done():
			return Record{}, context.Cause(ctx)
		case <-w.ctx.Done():
			return Record{}, ErrClosed
		}
	}
}

// WaitTurn returns the turn.completed or turn.failed event of the turn
// that answered the prompt messageID, skipping every other event. A
// prompt sent after the Watcher was created (or that StartAt covers)
// cannot be missed.
func (w *Watcher) WaitTurn(ctx context.Context, messageID string) (envelope.Event, error) {
	for {
		e, err := w.Next(ctx)
		if err != nil {
			return envelope.Event{}, fmt.Errorf("waiting for the turn of %q: %w", messageID, err)
		}
		if (e.Type == envelope.EventTurnCompleted || e.Type == envelope.EventTurnFailed) && slices.Contains(e.MessageIDs, messageID) {
			return e, nil
		}
	}
}

func (w *Watcher) report(err error) {
	if w.opts.ErrorFunc != nil {
		w.opts.ErrorFunc(err)
	}
}

func (w *Watcher) matches(e envelope.Event) bool {
	if w.opts.SessionID != "" && e.SessionID != w.opts.SessionID {
		return false
	}
	return len(w.opts.Types) == 0 || slices.Contains(w.opts.Types, e.Type)
}

// repeat reports whether id was seen among the last DedupWindow IDs, and
// remembers it. Events without an ID are never repeats.
func (w *Watcher) repeat(id string) bool {
	if id == "" || w.opts.DedupWindow == 0 {
		return false
	}
	if _, ok := w.seen[id]; ok {
		return true
	}
	if len(w.order) < w.opts.DedupWindow {
		w.order = append(w.order, id)
	} else {
		delete(w.seen, w.order[w.next])
		w.order[w.next] = id
		w.next = (w.next + 1) % w.opts.DedupWindow
	}
	w.seen[id] = struct{}{}
	return false
}

// forward moves one partition's messages and errors onto the shared
// channels until Close.
func (w *Watcher) forward(pc sarama.PartitionConsumer) {
	for {
		select {
		case m, ok := <-pc.Messages():
			if !ok {
				return
			}
			select {
			case w.msgs <- m:
			case <-w.ctx.Done():
				return
			}
		case err, ok := <-pc.Errors():
			if !ok {
				return
			}
			select {
			case w.errc <- err:
			case <-w.ctx.Done():
				return
			}
		case <-w.ctx.Done():
			return
		}
	}
}

// Close stops the Watcher and disconnects; it may be called more than
// once, and from another goroutine than Next's (which then returns
// ErrClosed).
func (w *Watcher) Close() error {
	var errs []error
	w.once.Do(func() {
		// The forwarders first, then the partition consumers (Close
		// drains them), then the consumer and its client.
		w.cancel()
		w.wg.Wait()
		for _, pc := range w.pcs {
			// Close returns the consumer errors nobody read: past ones,
			// which Sarama retried; nothing about closing.
			_ = pc.Close()
		}
		if w.consumer != nil {
			if err := w.consumer.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if w.client != nil && !w.client.Closed() {
			if err := w.client.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("client: closing the watcher: %w", err)
	}
	return nil
}
