package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/retry"
	"github.com/promptline/promptline/outbox"
)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Topics names the topics. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// Limits bound the accepted envelopes. Defaults to envelope's defaults.
	Limits envelope.Limits
	// MaxBatch is the most prompts admitted in one transaction. Defaults to 500.
	MaxBatch int
	// MaxBatchBytes bounds the prompts' values taken into one batch: the
	// batch ends at the prompt that reaches it (one at least). Defaults to
	// admission.MaxBatchBytesDefault (16 MiB).
	MaxBatchBytes int
	// RoundTripTimeout bounds each try of an admission (a batch, a
	// permission reply), which is retried after it: the partition's
	// context has no deadline, and a connection gone silent (a partition,
	// a failover with no reset) would otherwise hold the partition's
	// admission, and with it the group's rebalances, until the kernel
	// gave the connection up (about 15 minutes). A try given up is in
	// doubt; its retry is an exact retry of the same message IDs (P2).
	// Defaults to pgdb.RoundTripTimeoutDefault.
	RoundTripTimeout time.Duration
	// BufferBytes bounds the values of the prompts a partition holds
	// between Sarama's channel and the end of their admission, by their
	// real sizes: up to kafkautil.ChannelBufferMax small prompts wait at
	// hand for the next batch, few large ones. Defaults to
	// kafkautil.BufferBytesDefault.
	BufferBytes int
	// MaxMessageBytes is the largest message the rejects producer sends
	// (its Sarama Producer.MaxMessageBytes): a reject that would be larger
	// is published truncated. Defaults to kafkautil.MaxMessageBytesDefault.
	MaxMessageBytes int
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnRejectFunc runs once per reject of a prompt or a permission reply
	// with its outcome, "rejected" when published (whole or truncated) or
	// "reject_unpublished" when dropped as too large even without its
	// value or as refused by the broker for good (a keyless reject on a
	// compacted rejects topic), and its reason (the rejects header); not
	// for a prompt's published conflict, which admission classified and
	// counted (AdmitterConfig.OnAdmittedFunc): a reply's conflict is
	// counted here. Defaults to nothing.
	OnRejectFunc func(outcome, reason string)
	// OnWakeFunc runs for each wake consumed that the executor does not
	// take, with its result: "invalid" (skipped) or "local" (its prompt
	// already ran from a local wake, hint.go). The executor's OnWakeFunc
	// has the others. Defaults to nothing.
	OnWakeFunc func(result string)
	// OnWakeStartedFunc runs when a wake that carries its at started, or
	// joined, its session's run, locally or from Kafka, with the time since
	// that at (waiting for a free slot, MaxSessions, included). Defaults to
	// nothing.
	OnWakeStartedFunc func(sinceAt time.Duration)
	// WakesPartitions returns the partition count of the wakes topic; it
	// is asked at every assignment. With it, a prompt admitted here for a
	// session whose wakes partition is assigned here too runs at once,
	// without waiting for its wake to come back from Kafka (hint.go). When
	// nil, or when it fails, every prompt waits for its wake.
	WakesPartitions func() (int32, error)
	// TopicIDsFunc returns the ID Kafka gave each of the consumed topics
	// (prompts, wakes, permission replies) when it created it
	// (kafkautil.TopicIDs). A topic deleted and created again under the
	// same name while this process runs gets a new ID, and the positions
	// and committed offsets of the old one would skip as many records of
	// the new one (acknowledged prompts never admitted): when an ID
	// changes, the assignment ends and every partition of that topic is
	// read again from its oldest offset (OldestOffsetFunc); what had been
	// admitted comes back as exact retries. Defaults to nil: not checked.
	TopicIDsFunc func(topics []string) (map[string]sarama.Uuid, error)
	// OldestOffsetFunc returns the first offset a partition still holds
	// (kafkautil.OldestOffset); TopicIDsFunc needs it. Defaults to nil.
	OldestOffsetFunc func(topic string, partition int32) (int64, error)
	// CommittedMetadataFunc returns the metadata the group committed with
	// each of a topic's partitions' offsets (kafkautil.CommittedMetadata).
	// The consumer commits its marks with the ID of the topic they were
	// made in, so Setup also resets a partition whose offset was committed
	// under another ID than the topic's, which a process that never saw
	// the old ID (started, or joined the group, after the topic was
	// created again) could not tell otherwise. Defaults to nil: only the
	// IDs this process saw are compared.
	CommittedMetadataFunc func(topic string, partitions []int32) (map[int32]string, error)
	// TopicCheckInterval is how often TopicIDsFunc is asked while an
	// assignment lasts. Defaults to 5s.
	TopicCheckInterval time.Duration
}

const (
	maxBatchDefault           = 500
	topicCheckIntervalDefault = 5 * time.Second
)

// localRoute is what the consumer knows of the current assignment to wake
// sessions locally: the wakes topic's partition count and the wakes
// partitions assigned here.
type localRoute struct {
	partitions int32
	owned      map[int32]bool
}

// Consumer is the consumer-group handler for the prompts and wakes topics:
// it admits prompts in batches and hands wakes to the executor. An offset
// is marked only after what it stands for is durable: a prompt's after its
// admission committed (or its reject was published), a wake's after the
// session it woke went idle.
type Consumer struct {
	admitter  *admission.Admitter
	exec      *executor.Executor
	rejectPub *kafkautil.RejectPublisher
	cfg       ConsumerConfig
	log       *slog.Logger
	route     atomic.Pointer[localRoute] // nil: no local wakes

	// topicIDs are the IDs of the consumed topics that this process's
	// positions and the group's committed offsets refer to (TopicIDsFunc):
	// Setup writes them, and the watcher adds those Setup could not read.
	idsMu    sync.Mutex
	topicIDs map[string]sarama.Uuid
	// markIDs are the IDs of the current assignment's topics, as the
	// metadata of its marks (markMetadata); written by Setup.
	markIDs atomic.Pointer[map[string]string]
	// recreated is closed when a consumed topic of the current assignment
	// was created again: every claim of the assignment then returns, which
	// ends it (Sarama ends a session when one of its claims returns).
	recreated atomic.Pointer[chan struct{}]

	admissions *admission.Group
}

var _ sarama.ConsumerGroupHandler = (*Consumer)(nil)

// NewConsumer returns a Consumer. rejects publishes to the rejects topic.
// exec may be nil for a consumer of prompts alone (one whose group consumes
// no wakes topic): it admits, and runs nothing.
func NewConsumer(admitter *admission.Admitter, exec *executor.Executor, rejects sarama.SyncProducer, config *ConsumerConfig) *Consumer {
	cfg := *config
	cfg.Topics = cfg.Topics.WithDefaults()
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, maxBatchDefault)
	cfg.MaxBatchBytes = cmp.Or(cfg.MaxBatchBytes, admission.MaxBatchBytesDefault)
	cfg.RoundTripTimeout = cmp.Or(cfg.RoundTripTimeout, pgdb.RoundTripTimeoutDefault)
	cfg.BufferBytes = cmp.Or(cfg.BufferBytes, kafkautil.BufferBytesDefault)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, kafkautil.MaxMessageBytesDefault)
	cfg.TopicCheckInterval = cmp.Or(cfg.TopicCheckInterval, topicCheckIntervalDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{admitter: admitter, exec: exec, cfg: cfg, log: cfg.Logger, topicIDs: map[string]sarama.Uuid{}}
	c.rejectPub = &kafkautil.RejectPublisher{Producer: rejects, MaxMessageBytes: cfg.MaxMessageBytes, Logger: cfg.Logger,
		OnPublishedFunc: func(reason, outcome, sourceTopic string) {
			if outcome == "rejected" && reason == envelope.ReasonConflict && sourceTopic == cfg.Topics.Prompts {
				return
			}
			if f := cfg.OnRejectFunc; f != nil {
				f(outcome, reason)
			}
		}}
	c.admissions = admission.NewGroup(admitter, cfg.MaxBatch, c.afterAdmission)
	return c
}

// Setup is called when this process is assigned partitions.
func (c *Consumer) Setup(s sarama.ConsumerGroupSession) error {
	c.log.Info("partitions assigned", slog.Any("claims", s.Claims()), slog.Int("generation", int(s.GenerationID())))
	c.route.Store(nil)
	if err := c.checkTopics(s); err != nil {
		return err
	}
	if c.exec == nil || c.cfg.WakesPartitions == nil {
		return nil
	}
	n, err := c.cfg.WakesPartitions()
	if err != nil || n <= 0 {
		c.log.Warn("wakes topic's partition count unknown; prompts wait for their wakes from Kafka", slog.Any("error", err))
		return nil
	}
	r := &localRoute{partitions: n, owned: map[int32]bool{}}
	for _, p := range s.Claims()[c.cfg.Topics.Wakes] {
		r.owned[p] = true
	}
	c.route.Store(r)
	return nil
}

// recreatedChan is the current assignment's recreated channel; nil (never
// ready) before the first Setup.
func (c *Consumer) recreatedChan() <-chan struct{} {
	if p := c.recreated.Load(); p != nil {
		return *p
	}
	return nil
}

// consumedTopics are the topics of the group's subscription.
func (c *Consumer) consumedTopics() []string {
	return []string{c.cfg.Topics.Prompts, c.cfg.Topics.Wakes, c.cfg.Topics.PermissionReplies}
}

// checkTopics runs before the assignment's claims start. A consumed topic
// whose ID differs from the one this process last saw was deleted and
// created again: its claimed partitions are reset to their oldest offset,
// below whatever a position of the old topic committed onto the new one
// (Kafka drops a deleted topic's committed offsets, but a member still
// fetching at its old position, or marking after the recreation, commits
// offsets of the old topic's numbering onto the new one). Then it watches
// the IDs for as long as the assignment lasts. A failed lookup of the IDs
// leaves them unchecked until the next look; a failed lookup of an oldest
// offset fails the assignment, which is joined again with the IDs still to
// be reset.
func (c *Consumer) checkTopics(s sarama.ConsumerGroupSession) error {
	recreated := make(chan struct{})
	c.recreated.Store(&recreated)
	if c.cfg.TopicIDsFunc == nil || c.cfg.OldestOffsetFunc == nil {
		return nil
	}
	topics := c.consumedTopics()
	now, err := c.lookupTopicIDs(topics)
	if err != nil {
		c.log.Warn("topic IDs unknown; a topic created again is not told from the old one until they are read", slog.Any("error", err))
	}
	c.idsMu.Lock()
	defer c.idsMu.Unlock()
	// The IDs are recorded only once every reset is made: a failed Setup
	// ends its session, whose resets may never be committed, so the next
	// Setup resets every topic of now again, not only the one that failed.
	for topic, id := range now {
		parts := c.partsToReset(s, topic, id)
		for _, p := range parts {
			oldest, err := c.cfg.OldestOffsetFunc(topic, p)
			if err != nil {
				return fmt.Errorf("topic %s was created again: %w", topic, err)
			}
			s.ResetOffset(topic, p, oldest, id.String())
		}
		if len(parts) > 0 {
			c.log.Warn("topic deleted and created again: its partitions are read again from their oldest offset",
				slog.String("topic", topic), slog.Any("partitions", parts))
		}
	}
	maps.Copy(c.topicIDs, now)
	markIDs := make(map[string]string, len(c.topicIDs))
	for topic, id := range c.topicIDs {
		markIDs[topic] = id.String()
	}
	c.markIDs.Store(&markIDs)
	known := maps.Clone(c.topicIDs)
	go c.watchTopics(s.Context(), topics, known, recreated)
	return nil
}

// partsToReset are the claimed partitions of topic, whose ID is id now,
// to read again from their oldest offset: all of them when this process
// saw the topic under another ID, else those whose offset the group
// committed under another ID (CommittedMetadataFunc; a commit with no ID,
// an older member's, is taken as it is). c.idsMu is held.
func (c *Consumer) partsToReset(s sarama.ConsumerGroupSession, topic string, id sarama.Uuid) []int32 {
	parts := s.Claims()[topic]
	if prev, seen := c.topicIDs[topic]; seen && prev != id {
		return parts
	}
	if c.cfg.CommittedMetadataFunc == nil || len(parts) == 0 {
		return nil
	}
	meta, err := within(func() (map[int32]string, error) { return c.cfg.CommittedMetadataFunc(topic, parts) },
		"reading the committed offsets of "+topic)
	if err != nil {
		c.log.Warn("committed offsets' topic IDs unknown; an offset committed in a topic deleted since is not told apart",
			slog.String("topic", topic), slog.Any("error", err))
		return nil
	}
	var reset []int32
	for _, p := range parts {
		if m := meta[p]; m != "" && m != id.String() {
			reset = append(reset, p)
		}
	}
	return reset
}

// markMetadata is the metadata of a mark in topic: the topic's ID as the
// current assignment knows it, "" when unknown.
func (c *Consumer) markMetadata(topic string) string {
	if p := c.markIDs.Load(); p != nil {
		return (*p)[topic]
	}
	return ""
}

// topicLookupTimeout bounds the lookup of the topic IDs in Setup. Sarama
// bounds a request by its read timeout (15s), and the broker asked may be
// one that is stopped and not yet cut off: the assignment's start must
// not wait for it. A lookup given up is a failed one (checked at the next
// look); it finishes on its own within the read timeout.
const topicLookupTimeout = 2 * time.Second

func (c *Consumer) lookupTopicIDs(topics []string) (map[string]sarama.Uuid, error) {
	return within(func() (map[string]sarama.Uuid, error) { return c.cfg.TopicIDsFunc(topics) },
		fmt.Sprintf("reading the IDs of %v", topics))
}

// within is f's answer, or an error naming what when f gives none within
// topicLookupTimeout; f then finishes on its own.
func within[T any](f func() (T, error), what string) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	timer := time.NewTimer(topicLookupTimeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
		var zero T
		return zero, fmt.Errorf("%s: no answer within %s", what, topicLookupTimeout)
	}
}

// watchTopics closes recreated when a topic of known gets another ID, or
// returns when ctx (the assignment's) ends. A topic missing from known
// (Setup's lookup failed) is known from its first ID read here, recorded
// for the next Setup too: else a topic created again during the
// assignment would go unnoticed, and the next Setup would take its new ID
// for the first one.
func (c *Consumer) watchTopics(ctx context.Context, topics []string, known map[string]sarama.Uuid, recreated chan struct{}) {
	tick := time.NewTicker(c.cfg.TopicCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now, err := c.cfg.TopicIDsFunc(topics)
		if err != nil {
			continue
		}
		for topic, id := range now {
			prev, ok := known[topic]
			switch {
			case !ok:
				known[topic] = id
				c.idsMu.Lock()
				if _, seen := c.topicIDs[topic]; !seen {
					c.topicIDs[topic] = id
				}
				c.idsMu.Unlock()
			case prev != id:
				c.log.Warn("topic deleted and created again; ending the assignment to read it again from its oldest offset",
					slog.String("topic", topic))
				close(recreated)
				return
			}
		}
	}
}

// afterAdmission runs right after each admission commit, before any offset
// is marked. The crash point comes first, so that a crash there leaves no
// local run behind: the prompt is redelivered, an exact retry.
func (c *Consumer) afterAdmission(wakes []outbox.Row) {
	faults.Hit(faults.AdmissionAfterCommit)
	c.wakeLocally(wakes)
}

// wakeLocally hands the sessions of wakes just committed to the executor
// when their wakes partition is assigned here. The relay publishes wakes
// with the murmur2 partitioner of every promptline client
// (kafkautil.NewConfig), so the partition computed here is the one the wake
// will arrive on.
func (c *Consumer) wakeLocally(wakes []outbox.Row) {
	r := c.route.Load()
	if r == nil || len(wakes) == 0 {
		return
	}
	for _, w := range wakes {
		p := kafkautil.Murmur2Partition([]byte(w.Key), r.partitions)
		if !r.owned[p] || !c.exec.WakeLocal(w.Key, p, w.Payload) {
			continue
		}
		if f := c.cfg.OnWakeStartedFunc; f != nil {
			var wk envelope.Wake
			if json.Unmarshal(w.Payload, &wk) == nil && !wk.At.IsZero() {
				f(max(time.Since(wk.At), 0))
			}
		}
	}
}

// Cleanup is called when the assignment ends (rebalance or shutdown). It
// must not block the rebalance: runs of sessions on the lost wakes
// partitions are told to stop after their current turn and release with a
// wake, which reaches the partitions' next owner. The claim, not the
// partition, keeps them safe meanwhile.
func (c *Consumer) Cleanup(s sarama.ConsumerGroupSession) error {
	c.route.Store(nil)
	if parts := s.Claims()[c.cfg.Topics.Wakes]; len(parts) > 0 {
		c.exec.Revoke(parts)
	}
	return nil
}

// ConsumeClaim consumes one partition until the assignment ends.
func (c *Consumer) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	switch claim.Topic() {
	case c.cfg.Topics.Prompts:
		return c.consumePrompts(s, claim)
	case c.cfg.Topics.Wakes:
		return c.consumeWakes(s, claim)
	case c.cfg.Topics.PermissionReplies:
		return c.consumeReplies(s, claim)
	}
	return fmt.Errorf("consumer: unexpected topic %q", claim.Topic())
}

func (c *Consumer) consumePrompts(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx, cancel := context.WithCancel(s.Context())
	defer cancel() // ends the reader below
	gate := newByteGate(c.cfg.BufferBytes)
	msgs := make(chan *sarama.ConsumerMessage, kafkautil.ChannelBufferMax)
	go readBounded(ctx, claim.Messages(), msgs, gate)
	recreated := c.recreatedChan()
	for {
		var first *sarama.ConsumerMessage
		select {
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			first = m
		case <-ctx.Done():
			return nil
		case <-recreated:
			return nil // the next assignment reads the topic again (checkTopics)
		}
		batch, bytes := fillBatch(first, msgs, c.cfg.MaxBatch, c.cfg.MaxBatchBytes)
		if err := c.handlePrompts(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return nil // rebalance or shutdown: the next owner redelivers
			}
			return err
		}
		s.MarkMessage(batch[len(batch)-1], c.markMetadata(claim.Topic()))
		gate.release(bytes) // the values fillBatch counted, as readBounded acquired them
	}
}

// readBounded moves the messages of a partition from Sarama's channel to
// out while the values taken and not yet released through gate stay
// within its bytes, and closes out when in closes. Sarama's channel
// counts messages only, so it is kept short (kafkautil.ChannelBufferFor)
// and this queue holds up to its capacity of small prompts, or few large
// ones: a backlog of prompts of a megabyte filled 1024 of them per
// partition.
func readBounded(ctx context.Context, in <-chan *sarama.ConsumerMessage, out chan<- *sarama.ConsumerMessage, gate *byteGate) {
	defer close(out)
	for {
		var m *sarama.ConsumerMessage
		select {
		case v, ok := <-in:
			if !ok {
				return
			}
			m = v
		case <-ctx.Done():
			return
		}
		if !gate.acquire(ctx, len(m.Value)) {
			return
		}
		select {
		case out <- m:
		case <-ctx.Done():
			return
		}
	}
}

// byteGate counts the bytes of values taken and not yet released, up to
// max; one value larger than max passes alone. One goroutine acquires and
// one releases.
type byteGate struct {
	mu    sync.Mutex
	used  int
	max   int
	freed chan struct{}
}

func newByteGate(max int) *byteGate { return &byteGate{max: max, freed: make(chan struct{}, 1)} }

// acquire waits until n more bytes fit (or nothing is held) and takes
// them; false when ctx ended first.
func (g *byteGate) acquire(ctx context.Context, n int) bool {
	for {
		g.mu.Lock()
		if g.used == 0 || g.used+n <= g.max {
			g.used += n
			g.mu.Unlock()
			return true
		}
		g.mu.Unlock()
		select {
		case <-g.freed:
		case <-ctx.Done():
			return false
		}
	}
}

func (g *byteGate) release(n int) {
	g.mu.Lock()
	g.used -= n
	g.mu.Unlock()
	select {
	case g.freed <- struct{}{}:
	default:
	}
}

// fillBatch is first and what is already at hand in msgs, without
// waiting: batches grow with the backlog and stay small when traffic is
// light. A batch ends at maxBatch messages, or at the message that brings
// its values to maxBytes: by count alone, a backlog of prompts of a
// megabyte made one admission of hundreds of megabytes, longer than the
// statement timeout, failed again at every retry of the same batch. It
// returns the batch and the bytes of its values (what the byte gate
// released after its admission counts).
func fillBatch(first *sarama.ConsumerMessage, msgs <-chan *sarama.ConsumerMessage, maxBatch, maxBytes int) (batch []*sarama.ConsumerMessage, bytes int) {
	batch = []*sarama.ConsumerMessage{first}
	bytes = len(first.Value)
	for len(batch) < maxBatch && bytes < maxBytes {
		select {
		case m, ok := <-msgs:
			if !ok {
				return batch, bytes
			}
			batch = append(batch, m)
			bytes += len(m.Value)
		default:
			return batch, bytes
		}
	}
	return batch, bytes
}

// handlePrompts decodes, admits and rejects one batch, retrying while
// Postgres or the rejects topic is unavailable: the offset must not move
// before every message of the batch is durable somewhere. What no retry
// can fix becomes a reject instead (docs/design.md, invariant 13): a data error
// of Postgres for one prompt, a reject too large to publish whole.
func (c *Consumer) handlePrompts(ctx context.Context, batch []*sarama.ConsumerMessage) error {
	var good []admission.Incoming
	var goodMsgs []*sarama.ConsumerMessage
	var rejects []*sarama.ProducerMessage
	for _, m := range batch {
		var p envelope.Prompt
		err := checkHeaders(m, c.cfg.Limits)
		if err == nil {
			p, err = envelope.Decode(m.Key, m.Value, c.cfg.Limits)
		}
		if err != nil {
			rejects = append(rejects, c.reject(m, asReject(err)))
			continue
		}
		good = append(good, admission.Incoming{Prompt: p, Source: admission.Source{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}})
		goodMsgs = append(goodMsgs, m)
	}
	outcomes, err := c.admitRetrying(ctx, good, c.admissions.Admit)
	if isDataError(err) {
		// A data error fails the whole transaction, which may have held the
		// batches of other partitions too (admission.Group): first this batch
		// alone, then, if it is this batch, its prompts one by one, so that
		// only the prompts Postgres refuses are rejected. One by one is the
		// batch's order, and a later copy of an ID is then classified
		// against the stored first one, as the batch would have.
		outcomes, err = c.admitRetrying(ctx, good, c.admissions.AdmitAlone)
		if isDataError(err) {
			c.log.WarnContext(ctx, "admission refused by Postgres with a data error; admitting the batch's prompts one by one",
				slog.Int("prompts", len(good)), slog.Any("error", err))
			outcomes = make([]admission.Outcome, len(good))
			for i := range good {
				o, err := c.admitRetrying(ctx, good[i:i+1], c.admissions.AdmitAlone)
				switch {
				case isDataError(err):
					rejects = append(rejects, c.reject(goodMsgs[i], dataReject(err)))
				case err != nil:
					return err
				default:
					outcomes[i] = o[0]
				}
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	for i, o := range outcomes {
		if o == admission.Conflict {
			p := good[i].Prompt
			rejects = append(rejects, c.reject(goodMsgs[i], &envelope.RejectError{
				Reason: envelope.ReasonConflict,
				Detail: fmt.Sprintf("message_id %q was admitted before with another payload, or names a message of a transcript (a tool call's ID among them)", p.MessageID),
			}))
		}
	}
	return c.rejectPub.Publish(ctx, rejects)
}

// admitRetrying runs admit until it succeeds, retrying with a bounded
// backoff every error but a data error (isDataError), which it returns
// with the outcomes of nothing; it also returns when ctx ends.
func (c *Consumer) admitRetrying(ctx context.Context, batch []admission.Incoming,
	admit func(context.Context, []admission.Incoming) ([]admission.Outcome, error),
) ([]admission.Outcome, error) {
	var outcomes []admission.Outcome
	err := retry.Do(ctx, admissionRetry(func(err error, wait time.Duration) {
		c.log.WarnContext(ctx, "admission failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
	}), func() error {
		actx, cancel := context.WithTimeout(ctx, c.cfg.RoundTripTimeout)
		defer cancel()
		var err error
		outcomes, err = admit(actx, batch)
		return err
	})
	switch {
	case err == nil:
		return outcomes, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	c.log.WarnContext(ctx, "admission refused by Postgres with a data error", slog.Int("prompts", len(batch)), slog.Any("error", err))
	return nil, err
}

// admissionRetry is how admission runs a write again: every error but a
// data error (isDataError), from 100 ms doubling to 5 s, until ctx ends.
func admissionRetry(logRetry func(err error, wait time.Duration)) retry.Policy {
	return retry.Policy{
		Min: 100 * time.Millisecond, Max: 5 * time.Second,
		Final:   isDataError,
		OnRetry: func(_ int, err error, wait time.Duration) { logRetry(err, wait) },
	}
}

// isDataError reports whether err carries a deterministic data error of
// Postgres, one that the same statement on the same data gives again on
// every retry (admission.AsDataError says which: SQLSTATE class 22 or
// 23). Everything else is retried.
func isDataError(err error) bool {
	_, ok := admission.AsDataError(err)
	return ok
}

// dataReject is the reject of a message that Postgres refused with err, a
// data error.
func dataReject(err error) *envelope.RejectError {
	de, _ := admission.AsDataError(err)
	return de.Reject()
}

// checkHeaders enforces the header limits on m, before its value is
// decoded: prompts and permission replies alike.
func checkHeaders(m *sarama.ConsumerMessage, limits envelope.Limits) error {
	n := 0
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return envelope.CheckHeaders(len(m.Headers), n, limits)
}

// asReject returns the *RejectError of a decoder's error.
func asReject(err error) *envelope.RejectError {
	var re *envelope.RejectError
	if !errors.As(err, &re) {
		re = &envelope.RejectError{Reason: envelope.ReasonInvalidJSON, Detail: err.Error()}
	}
	return re
}

// reject builds the rejects-topic message for m (kafkautil.RejectMessage:
// the original bytes, key and headers, the reason and where it came from
// in headers) and logs it.
func (c *Consumer) reject(m *sarama.ConsumerMessage, re *envelope.RejectError) *sarama.ProducerMessage {
	c.log.Info("prompt rejected", slog.String("reason", re.Reason), slog.String("detail", re.Detail),
		slog.String("source_topic", m.Topic), slog.Int("source_partition", int(m.Partition)), slog.Int64("source_offset", m.Offset))
	return kafkautil.RejectMessage(c.cfg.Topics.Rejects, m, re.Reason, re.Detail)
}

// consumeWakes hands each wake to the executor and commits the
// partition's offset past a wake once the session it woke has gone idle,
// and every earlier wake's session too, so that a crash mid-turn
// redelivers the wake. A run that lasts (a session whose prompts keep
// arriving, a turn waiting long on its provider) holds the committed
// offset, never the partition: the wakes after it are handed over all the
// same (wakeMarks says what is kept for that).
func (c *Consumer) consumeWakes(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := s.Context()
	meta := c.markMetadata(claim.Topic())
	marks := newWakeMarks(func(next int64) { s.MarkOffset(claim.Topic(), claim.Partition(), next, meta) })
	msgs := claim.Messages()
	recreated := c.recreatedChan()
	for {
		var m *sarama.ConsumerMessage
		var ok bool
		select {
		case m, ok = <-msgs:
			if !ok {
				// Revoked: the runs under way may still go idle before
				// the session ends, and their offsets be committed.
				if marks.idle() {
					return nil
				}
				msgs = nil
				continue
			}
		case <-marks.head():
			marks.mark()
			if msgs == nil && marks.idle() {
				return nil
			}
			continue
		case <-ctx.Done():
			return nil
		case <-recreated:
			return nil // as on a rebalance; the next assignment reads the topic again
		}
		var w envelope.Wake
		if err := json.Unmarshal(m.Value, &w); err != nil || w.SessionID == "" {
			// Wakes are internal hints; a bad one is logged and skipped.
			c.log.Warn("invalid wake skipped", slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset))
			if f := c.cfg.OnWakeFunc; f != nil {
				f("invalid")
			}
			marks.add(m.Offset, nil)
			continue
		}
		done, local := c.exec.TakeLocal(m.Value, m.Partition)
		if local {
			if f := c.cfg.OnWakeFunc; f != nil {
				f("local")
			}
			marks.add(m.Offset, done)
			continue
		}
		done, err := c.exec.Wake(ctx, w.SessionID, m.Partition)
		if err != nil {
			return nil // shutting down or rebalancing; the wake is redelivered
		}
		if f := c.cfg.OnWakeStartedFunc; f != nil && !w.At.IsZero() {
			// The run started (or the running one took the wake): the
			// latency includes waiting for a free slot (MaxSessions).
			f(max(time.Since(w.At), 0))
		}
		marks.add(m.Offset, done)
	}
}

// consumeReplies admits permission replies one by one, with the admission
// discipline of prompts: exactly once, malformed and conflicting ones to
// the rejects topic, the offset marked only after.
func (c *Consumer) consumeReplies(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := s.Context()
	recreated := c.recreatedChan()
	for {
		var m *sarama.ConsumerMessage
		var ok bool
		select {
		case m, ok = <-claim.Messages():
			if !ok {
				return nil
			}
		case <-ctx.Done():
			return nil
		case <-recreated:
			return nil
		}
		rejects, err := c.handleReply(ctx, m)
		if err != nil {
			return nil // shutting down or rebalancing; the reply is redelivered
		}
		if err := c.rejectPub.Publish(ctx, rejects); err != nil {
			return nil
		}
		s.MarkMessage(m, c.markMetadata(m.Topic))
	}
}

// handleReply decodes and admits one permission reply, retrying while
// Postgres is unavailable, and returns its reject, if any: a malformed
// reply, one admission refuses (unknown request, conflict), or one Postgres
// refuses with a data error. It fails only when ctx ends.
func (c *Consumer) handleReply(ctx context.Context, m *sarama.ConsumerMessage) ([]*sarama.ProducerMessage, error) {
	var r envelope.PermissionReply
	err := checkHeaders(m, c.cfg.Limits)
	if err == nil {
		r, err = envelope.DecodeReply(m.Value, c.cfg.Limits)
	}
	if err != nil {
		return []*sarama.ProducerMessage{c.reject(m, asReject(err))}, nil
	}
	var out admission.ReplyOutcome
	err = retry.Do(ctx, admissionRetry(func(err error, wait time.Duration) {
		c.log.WarnContext(ctx, "admitting permission reply failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
	}), func() error {
		actx, cancel := context.WithTimeout(ctx, c.cfg.RoundTripTimeout)
		defer cancel()
		var err error
		out, err = c.admitter.AdmitReply(actx, m.Key, r, admission.Source{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset})
		return err
	})
	switch {
	case err == nil && out.Reason != "":
		return []*sarama.ProducerMessage{c.reject(m, &envelope.RejectError{Reason: out.Reason, Detail: out.Detail})}, nil
	case err == nil:
		return nil, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	c.log.WarnContext(ctx, "permission reply refused by Postgres with a data error", slog.Any("error", err))
	return []*sarama.ProducerMessage{c.reject(m, dataReject(err))}, nil
}
