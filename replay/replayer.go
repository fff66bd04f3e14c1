package replay

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/retry"
)

// Config configures a Replayer.
type Config struct {
	// Topics names the outbox targets of admission (wakes, events), the
	// prompts topic (what a rejects replay accepts) and the rejects topic.
	// Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// Limits bound accepted envelopes, as the live consumer's. Defaults to
	// envelope's defaults.
	Limits envelope.Limits
	// MaxBatch is the most messages of a partition classified and
	// admitted in one transaction. Defaults to 1000.
	MaxBatch int
	// MaxBatchBytes bounds the values of one batch as the live consumer's
	// (pipeline.ConsumerConfig.MaxBatchBytes): a batch ends once its
	// values reach it, the message that reaches it included. Defaults to
	// admission.MaxBatchBytesDefault (16 MiB).
	MaxBatchBytes int
	// Linger is how long a batch waits to fill up. Defaults to 10ms.
	Linger time.Duration
	// Rate caps messages per second over all partitions, so that a replay
	// does not starve live admission. Defaults to 0, no cap.
	Rate float64
	// Wake admits prompts with their own resume flag, so that their
	// sessions wake and run (re-executing them against providers).
	// Defaults to false: every replayed prompt is admitted with
	// resume=false.
	Wake bool
	// DryRun classifies without writing. Defaults to false.
	DryRun bool
	// PublishRejects publishes malformed and conflicting messages to the
	// rejects topic, as the live consumer does. Defaults to false: replay
	// is an operator tool and reports them instead.
	PublishRejects bool
	// MaxMessageBytes is the rejects producer's Producer.MaxMessageBytes:
	// a larger reject is published truncated, as live admission does.
	// Defaults to kafkautil.MaxMessageBytesDefault.
	MaxMessageBytes int
	// MaxRejections is how many rejected messages the report lists (all
	// are counted). Defaults to 1000; negative lists none.
	MaxRejections int
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnBatchFunc runs after each durable batch with the partition's next
	// offset. Defaults to nothing.
	OnBatchFunc func(partition int32, next int64)
	// StopGrace bounds a stop: once Run's ctx ends, the work in flight (a
	// batch's admission, and with PublishRejects the rejects of a batch
	// whose admission committed, retried while the rejects topic is away)
	// gets this long, then it is cancelled and its batch is not counted
	// (the resumed run replays it: its prompts duplicate, its rejects
	// published again). Defaults to StopGraceDefault.
	StopGrace time.Duration
}

// StopGraceDefault is Config.StopGrace's default, as the consumer's
// --shutdown-grace.
const StopGraceDefault = 30 * time.Second

// errStopGraceEnded ends the work of a stopped replay once its grace is
// over.
var errStopGraceEnded = errors.New("the stop's grace ended")

// ReasonTruncated is the replay reason of a rejects-topic message that
// was published truncated (kafkautil.Truncated): it is not the message
// that was sent, so it is never admitted from the rejects topic.
const ReasonTruncated = "truncated"

// The defaults of Config's MaxBatch and MaxRejections, exported so that
// the replay command's flags state them once.
const (
	MaxBatchDefault      = 1000
	MaxRejectionsDefault = 1000
)

const lingerDefault = 10 * time.Millisecond

// Replayer replays ranges of a topic through admission.
type Replayer struct {
	pool     *pgxpool.Pool
	client   sarama.Client
	rejects  *kafkautil.RejectPublisher
	admitter *admission.Admitter
	cfg      Config
	log      *slog.Logger
	limiter  *limiter

	mu         sync.Mutex
	parts      []*PartitionReport
	reasons    map[string]int64
	rejections []Rejection
	omitted    int64
	wouldAdmit map[string][]byte // dry run: IDs it would admit, and their hashes

	stopWaitLogged atomic.Bool // logStopWaits logged in this run
}

// New returns a Replayer. client reads the topic; rejects is needed only
// with PublishRejects.
func New(pool *pgxpool.Pool, client sarama.Client, rejects sarama.SyncProducer, config *Config) (*Replayer, error) {
	cfg := *config
	cfg.Topics = cfg.Topics.WithDefaults()
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, MaxBatchDefault)
	cfg.MaxBatchBytes = cmp.Or(cfg.MaxBatchBytes, admission.MaxBatchBytesDefault)
	cfg.Linger = cmp.Or(cfg.Linger, lingerDefault)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, StopGraceDefault)
	cfg.MaxRejections = max(0, cmp.Or(cfg.MaxRejections, MaxRejectionsDefault))
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.PublishRejects && rejects == nil:
		return nil, errors.New("replay: PublishRejects needs a producer")
	case cfg.PublishRejects && cfg.DryRun:
		return nil, errors.New("replay: a dry run publishes nothing")
	case cfg.Rate < 0:
		return nil, errors.New("replay: Rate must not be negative")
	case cfg.StopGrace < 0:
		return nil, errors.New("replay: StopGrace must not be negative")
	}
	if cfg.Rate > 0 {
		// Small batches keep the pace smooth: about ten per second.
		cfg.MaxBatch = max(1, min(cfg.MaxBatch, int(cfg.Rate/10)))
	}
	return &Replayer{
		pool: pool, client: client, cfg: cfg, log: cfg.Logger,
		rejects:    &kafkautil.RejectPublisher{Producer: rejects, MaxMessageBytes: cfg.MaxMessageBytes, Logger: cfg.Logger},
		admitter:   admission.NewAdmitter(pool, &admission.AdmitterConfig{Topics: cfg.Topics}),
		limiter:    newLimiter(cfg.Rate),
		reasons:    map[string]int64{},
		wouldAdmit: map[string][]byte{},
	}, nil
}

// Progress returns a snapshot of every partition, for progress bars.
func (r *Replayer) Progress() []PartitionReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PartitionReport, len(r.parts))
	for i, p := range r.parts {
		out[i] = *p
	}
	return out
}

// Run replays the ranges of topic and returns the report. Cancelling ctx
// stops the replay cleanly: batches in flight finish (or, if they cannot
// before their admission commits, are not counted; once it has committed,
// a batch also waits for its rejects to be published, with
// PublishRejects), for at most Config.StopGrace, after which what is still
// in flight is cancelled and its batch not counted; the report's next
// offsets say where to resume; the report then has Interrupted set and the
// error is nil. An error stops all partitions; the report is still
// returned for resuming.
func (r *Replayer) Run(ctx context.Context, topic string, ranges []Range) (*Report, error) {
	start := time.Now()
	r.mu.Lock()
	r.parts = make([]*PartitionReport, len(ranges))
	for i, rg := range ranges {
		r.parts[i] = &PartitionReport{Range: rg, First: -1, Last: -1, Next: rg.From}
	}
	r.mu.Unlock()
	r.stopWaitLogged.Store(false)

	consumer, err := sarama.NewConsumerFromClient(r.client)
	if err != nil {
		return r.report(topic, start, ctx), fmt.Errorf("replay: creating consumer: %w", err)
	}
	defer consumer.Close()

	stopCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// Work that was started finishes even when ctx ends (a batch is
	// committed whole or not counted), within the stop's grace: a stop
	// that waited for good (a rejects topic away, a database that does
	// not answer) would leave the operator only a second signal, which
	// exits without a report or a resume file.
	work, endWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer endWork(nil)
	defer context.AfterFunc(ctx, func() {
		grace := time.AfterFunc(r.cfg.StopGrace, func() { endWork(errStopGraceEnded) })
		context.AfterFunc(work, func() { grace.Stop() })
	})()
	var wg sync.WaitGroup
	errs := make([]error, len(ranges))
	for i, rg := range ranges {
		if rg.Empty() {
			continue
		}
		wg.Go(func() {
			if err := r.runPartition(stopCtx, work, consumer, topic, rg, r.parts[i]); err != nil {
				errs[i] = fmt.Errorf("replaying %s/%d: %w", topic, rg.Partition, err)
				stop(errs[i])
			}
		})
	}
	wg.Wait()
	return r.report(topic, start, ctx), errors.Join(errs...)
}

func (r *Replayer) report(topic string, start time.Time, ctx context.Context) *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &Report{
		Topic: topic, DryRun: r.cfg.DryRun, Wake: r.cfg.Wake, StartedAt: start.UTC(),
		Seconds: time.Since(start).Seconds(), Reasons: map[string]int64{},
		Rejections: slices.Clone(r.rejections), RejectionsOmitted: r.omitted, Complete: true,
	}
	for k, v := range r.reasons {
		rep.Reasons[k] = v
	}
	for _, p := range r.parts {
		rep.Partitions = append(rep.Partitions, *p)
		rep.Totals.plus(p.Counts)
		rep.Complete = rep.Complete && p.Done()
	}
	rep.Interrupted = !rep.Complete && ctx.Err() != nil
	if rep.Seconds > 0 {
		rep.Rate = float64(rep.Totals.Messages) / rep.Seconds
	}
	if rep.Rejections == nil {
		rep.Rejections = []Rejection{}
	}
	return rep
}

// runPartition replays one range. It returns nil when the range is done
// or ctx was cancelled between batches. work is the context of database
// and rejects work, which outlives ctx by the stop's grace.
func (r *Replayer) runPartition(ctx, work context.Context, consumer sarama.Consumer, topic string, rg Range, st *PartitionReport) error {
	pc, err := consumer.ConsumePartition(topic, rg.Partition, rg.From)
	if err != nil {
		return fmt.Errorf("consuming from offset %d: %w", rg.From, err)
	}
	defer pc.Close() // errors after the end are of no interest
	next := rg.From
	for {
		batch, end, err := r.nextBatch(ctx, pc, topic, rg.Partition, next, rg.To)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if len(batch) > 0 {
			if !r.limiter.wait(ctx, len(batch)) {
				return nil
			}
			res, err := r.process(ctx, work, topic, batch)
			if err != nil {
				if errors.Is(context.Cause(work), errStopGraceEnded) {
					r.log.Warn(fmt.Sprintf("replay: the stop's grace (--stop-grace %s) ended before the batch finished; "+
						"it is not counted, and the resumed run replays it (its prompts duplicate, its rejects published again)", r.cfg.StopGrace),
						slog.Int("partition", int(rg.Partition)), slog.Int64("from_offset", batch[0].Offset), slog.Any("error", err))
					return nil
				}
				if ctx.Err() != nil {
					return nil // stopped while retrying before its commit: the batch is not counted
				}
				return err
			}
			r.commit(st, batch, res)
			next = batch[len(batch)-1].Offset + 1
		}
		if end {
			r.mu.Lock()
			st.Next = rg.To
			r.mu.Unlock()
		}
		if r.cfg.OnBatchFunc != nil && len(batch) > 0 {
			r.cfg.OnBatchFunc(rg.Partition, batch[len(batch)-1].Offset+1)
		}
		if end {
			return nil
		}
	}
}

// nextBatch collects up to MaxBatch messages before offset to, next being
// the first offset not yet replayed. end reports that the range is
// exhausted: the last message is the one before to, the log skipped past
// it, or nothing left before to is ever delivered (transaction markers,
// records of aborted transactions: see invisibleUpTo).
func (r *Replayer) nextBatch(ctx context.Context, pc sarama.PartitionConsumer, topic string, partition int32, next, to int64) (batch []*sarama.ConsumerMessage, end bool, err error) {
	bytes := 0
	take := func(m *sarama.ConsumerMessage) (done bool) {
		if m.Offset >= to {
			return true
		}
		batch = append(batch, m)
		bytes += len(m.Value)
		return m.Offset >= to-1
	}
	probe := time.NewTicker(probeInterval)
	defer probe.Stop()
wait:
	for {
		select {
		case m := <-pc.Messages():
			if take(m) {
				return batch, true, nil
			}
			break wait
		case cerr := <-pc.Errors():
			return nil, false, cerr
		case <-probe.C:
			// Nothing came: the rest of the range may be records no
			// consumer is ever given.
			n, err := invisibleUpTo(r.client, topic, partition, next, to)
			if err != nil {
				r.log.WarnContext(ctx, "replay: looking past transaction markers failed; waiting for messages",
					slog.String("topic", topic), slog.Int("partition", int(partition)), slog.Any("error", err))
				continue
			}
			if n >= to {
				return nil, true, nil
			}
		case <-ctx.Done():
			return nil, false, nil
		}
	}
	linger := time.NewTimer(r.cfg.Linger)
	defer linger.Stop()
	for len(batch) < r.cfg.MaxBatch && bytes < r.cfg.MaxBatchBytes {
		select {
		case m := <-pc.Messages():
			if take(m) {
				return batch, true, nil
			}
		case cerr := <-pc.Errors():
			return nil, false, cerr
		case <-linger.C:
			return batch, false, nil
		case <-ctx.Done():
			return nil, false, nil
		}
	}
	return batch, false, nil
}

// result is the classification of one batch.
type result struct {
	outcomes   []Outcome
	rejections []Rejection // in batch order, one per non-admitted-or-duplicate message
}

type decoded struct {
	i  int // index in the batch
	in admission.Incoming
}

// process decodes, classifies and admits one batch. ctx is the stop
// signal, work the context of database work.
func (r *Replayer) process(ctx, work context.Context, topic string, batch []*sarama.ConsumerMessage) (result, error) {
	res := result{outcomes: make([]Outcome, len(batch))}
	rejs := make(map[int]Rejection)
	var good []decoded
	fromRejects := topic == r.cfg.Topics.Rejects
	for i, m := range batch {
		var orig, source string
		src := admission.Source{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		if fromRejects {
			orig = header(m, "reason")
			st := header(m, "source_topic")
			sp, perr := strconv.ParseInt(header(m, "source_partition"), 10, 32)
			so, oerr := strconv.ParseInt(header(m, "source_offset"), 10, 64)
			if st != "" && perr == nil && oerr == nil {
				src = admission.Source{Topic: st, Partition: int32(sp), Offset: so}
				source = fmt.Sprintf("%s/%d/%d", st, sp, so)
			}
			if st != "" && st != r.cfg.Topics.Prompts {
				res.outcomes[i] = Skipped
				rejs[i] = Rejection{Outcome: Skipped.String(), Reason: "not_a_prompt",
					Detail:         fmt.Sprintf("first published on %s, not on the prompts topic %s", st, r.cfg.Topics.Prompts),
					OriginalReason: orig, Source: source}
				continue
			}
		}
		if fromRejects && kafkautil.Truncated(m.Headers) {
			// Only a prefix of what was sent (or without its key): never
			// admitted from here, whatever the limits; the original is at
			// its source offset.
			res.outcomes[i] = Malformed
			rejs[i] = Rejection{Outcome: Malformed.String(), Reason: ReasonTruncated,
				Detail:         "a truncated reject holds a prefix of the original; replay the source topic at " + source,
				OriginalReason: orig, Source: source}
			continue
		}
		// The header limits of live admission, over the headers the
		// producer sent (in a reject, those after promptline's).
		headers := m.Headers
		if fromRejects {
			headers = kafkautil.OriginalHeaders(headers)
		}
		hbytes := 0
		for _, h := range headers {
			if h != nil {
				hbytes += len(h.Key) + len(h.Value)
			}
		}
		err := envelope.CheckHeaders(len(headers), hbytes, r.cfg.Limits)
		var p envelope.Prompt
		if err == nil {
			p, err = envelope.Decode(m.Key, m.Value, r.cfg.Limits)
		}
		if err != nil {
			var re *envelope.RejectError
			if !errors.As(err, &re) {
				re = &envelope.RejectError{Reason: envelope.ReasonInvalidJSON, Detail: err.Error()}
			}
			res.outcomes[i] = Malformed
			rejs[i] = Rejection{Outcome: Malformed.String(), Reason: re.Reason, Detail: re.Detail, OriginalReason: orig, Source: source}
			continue
		}
		if !r.cfg.Wake {
			p.Resume = new(false)
		}
		good = append(good, decoded{i: i, in: admission.Incoming{Prompt: p, Source: src}})
		if fromRejects {
			rejs[i] = Rejection{OriginalReason: orig, Source: source} // kept only if rejected again
		}
	}

	refused, err := r.classify(ctx, work, good, res.outcomes)
	if err != nil {
		return res, err
	}
	for _, d := range good {
		i := d.i
		j := rejs[i]
		switch {
		case refused[i] != nil:
			j.Outcome, j.Reason, j.Detail = Malformed.String(), refused[i].Reason, refused[i].Detail
		case res.outcomes[i] == Conflict:
			j.Outcome, j.Reason = Conflict.String(), envelope.ReasonConflict
			j.Detail = fmt.Sprintf("message_id %q was admitted before with another payload, or names a message of a transcript (a tool call's ID among them)", d.in.Prompt.MessageID)
		default:
			continue
		}
		j.MessageID, j.SessionID = d.in.Prompt.MessageID, d.in.Prompt.SessionID
		rejs[i] = j
	}
	for i, m := range batch {
		j, ok := rejs[i]
		if !ok || j.Outcome == "" {
			continue
		}
		j.Partition, j.Offset = m.Partition, m.Offset
		res.rejections = append(res.rejections, j)
	}
	if r.cfg.PublishRejects {
		// The batch's admission has committed: it finishes as a unit, so
		// its rejects are published on work, and a stop waits for them
		// (a batch is committed whole or not counted).
		if len(res.rejections) > 0 {
			defer context.AfterFunc(ctx, r.logStopWaits)()
		}
		if err := r.publishRejects(work, batch, res.rejections); err != nil {
			return res, err
		}
	}
	return res, nil
}

// logStopWaits says, once per run, that the stop waits for the rejects of
// a batch whose admission committed.
func (r *Replayer) logStopWaits() {
	if r.stopWaitLogged.Swap(true) {
		return
	}
	r.log.Warn(fmt.Sprintf("replay: the stop waits for the rejects of the batches already admitted to be published "+
		"(retried while the rejects topic is unavailable), for at most %s (--stop-grace); a second SIGINT exits at once", r.cfg.StopGrace))
}

// classify fills the outcomes of the decoded prompts. Prompts whose ID is
// already admitted are classified by a read-only query (the package's
// invariant 2, doc.go); the rest go through Admit, unless this is a dry
// run. A prompt Postgres refuses with a data error is Malformed, and
// refused holds its reject by batch index (docs/design.md, invariant 13).
func (r *Replayer) classify(ctx, work context.Context, good []decoded, outcomes []Outcome) (refused map[int]*envelope.RejectError, err error) {
	if len(good) == 0 {
		return nil, nil
	}
	ids := make([]string, len(good))
	for k, d := range good {
		ids[k] = d.in.Prompt.MessageID
	}
	var prior map[string]admission.Stored
	err = retried(ctx, r.log, "reading admitted inputs", func() error {
		var err error
		prior, err = admission.ReadStored(work, r.pool, ids)
		return err
	})
	if err != nil {
		return nil, err
	}
	var toAdmit []decoded
	for _, d := range good {
		p := d.in.Prompt
		e, found := prior[p.MessageID]
		if !found {
			if r.cfg.DryRun {
				outcomes[d.i] = r.wouldAdmitOutcome(p)
			} else {
				toAdmit = append(toAdmit, d)
			}
			continue
		}
		// Admission's rule (invariants 2 and 3): an exact retry arms its
		// wake only in a run that wakes (--wake).
		o, arm := admission.Classify(e, p.Hash(), r.cfg.Wake && p.Resumes())
		if arm && !r.cfg.DryRun {
			toAdmit = append(toAdmit, d) // an exact retry that arms the wake
			continue
		}
		outcomes[d.i] = Outcome(o)
	}
	if len(toAdmit) == 0 {
		return nil, nil
	}
	in := make([]admission.Incoming, len(toAdmit))
	for k, d := range toAdmit {
		in[k] = d.in
	}
	var got []admission.Outcome
	err = retried(ctx, r.log, "admitting", func() error {
		var err error
		got, err = r.admitter.Admit(work, in)
		return err
	})
	if _, ok := admission.AsDataError(err); ok {
		r.log.WarnContext(ctx, "replay: admission refused by Postgres with a data error; admitting the batch's prompts one by one",
			slog.Int("prompts", len(in)), slog.Any("error", err))
		return r.admitOneByOne(ctx, work, toAdmit, outcomes)
	}
	if err != nil {
		return nil, err
	}
	for k, d := range toAdmit {
		outcomes[d.i] = Outcome(got[k])
	}
	return nil, nil
}

// admitOneByOne admits the prompts of a batch that Postgres refused with a
// data error each in a transaction of its own, so that only the prompts
// it refuses are rejected, as live admission does (pipeline.Consumer). It
// goes in the batch's order: a later copy of an ID is then classified
// against the stored first one, as the batch would have been. Once the
// first prompt commits, the batch is partly admitted: it finishes as a
// unit, its retries bounded by their tries, not by the stop signal ctx.
func (r *Replayer) admitOneByOne(ctx, work context.Context, toAdmit []decoded, outcomes []Outcome) (map[int]*envelope.RejectError, error) {
	refused := map[int]*envelope.RejectError{}
	for _, d := range toAdmit {
		var got []admission.Outcome
		err := retried(work, r.log, "admitting one prompt", func() error {
			var err error
			got, err = r.admitter.Admit(work, []admission.Incoming{d.in})
			return err
		})
		if de, ok := admission.AsDataError(err); ok {
			r.log.WarnContext(ctx, "replay: prompt refused by Postgres with a data error; rejected",
				slog.String("message_id", d.in.Prompt.MessageID), slog.String("source_topic", d.in.Source.Topic),
				slog.Int("source_partition", int(d.in.Source.Partition)), slog.Int64("source_offset", d.in.Source.Offset),
				slog.Any("error", err))
			outcomes[d.i] = Malformed
			refused[d.i] = de.Reject()
			continue
		}
		if err != nil {
			return nil, err
		}
		outcomes[d.i] = Outcome(got[0])
	}
	return refused, nil
}

// wouldAdmitOutcome classifies, in a dry run, a prompt whose ID is not in
// inputs: against the IDs the run would already have admitted.
func (r *Replayer) wouldAdmitOutcome(p envelope.Prompt) Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, seen := r.wouldAdmit[p.MessageID]
	switch {
	case !seen:
		r.wouldAdmit[p.MessageID] = p.Hash()
		return Admitted
	case bytes.Equal(h, p.Hash()):
		return Duplicate
	}
	return Conflict
}

// commit counts a durable batch and moves the partition's next offset.
func (r *Replayer) commit(st *PartitionReport, batch []*sarama.ConsumerMessage, res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.First < 0 {
		st.First = batch[0].Offset
	}
	last := batch[len(batch)-1].Offset
	st.Last, st.Next = last, last+1
	for i, m := range batch {
		st.Messages++
		st.Bytes += int64(len(m.Key) + len(m.Value))
		st.add(res.outcomes[i])
	}
	for _, j := range res.rejections {
		r.reasons[j.Reason]++
		if len(r.rejections) < r.cfg.MaxRejections {
			r.rejections = append(r.rejections, j)
		} else {
			r.omitted++
		}
	}
}

// publishRejects sends the batch's rejected messages to the rejects topic
// with promptline's reject headers followed by the original's
// (kafkautil.RejectHeaders).
func (r *Replayer) publishRejects(ctx context.Context, batch []*sarama.ConsumerMessage, rejs []Rejection) error {
	if len(rejs) == 0 {
		return nil
	}
	byOffset := make(map[int64]*sarama.ConsumerMessage, len(batch))
	for _, m := range batch {
		byOffset[m.Offset] = m
	}
	msgs := make([]*sarama.ProducerMessage, 0, len(rejs))
	for _, j := range rejs {
		msgs = append(msgs, kafkautil.RejectMessage(r.cfg.Topics.Rejects, byOffset[j.Offset], j.Reason, j.Detail))
	}
	// Transient errors are retried until they pass (ctx is the work
	// context: not until the replay is stopped); a reject too large to
	// publish whole goes out truncated.
	return r.rejects.Publish(ctx, msgs)
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// retried runs f until it succeeds, backing off, for at most
// retryAttempts tries or until ctx (the stop signal) ends. A data error of
// Postgres (admission.AsDataError) is the same on every try: it is
// returned at once, for the caller to reject the prompt.
func retried(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	err := retry.Do(ctx, retry.Policy{
		Min: 100 * time.Millisecond, Max: 5 * time.Second, Tries: retryAttempts,
		Final: func(err error) bool {
			_, ok := admission.AsDataError(err)
			return ok
		},
		OnRetry: func(_ int, err error, wait time.Duration) {
			log.WarnContext(ctx, what+" failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
		},
	}, f)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

const retryAttempts = 6
