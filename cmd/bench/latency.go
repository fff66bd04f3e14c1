package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/pipeline"
)

// latencyOpts configure one end-to-end latency run.
type latencyOpts struct {
	Pool       poolOpts
	Partitions int32
	// Rate is the offered load in prompts per second.
	Rate float64
	// Duration of the offered load.
	Duration time.Duration
	// Warmup is the start of the run whose prompts are not measured.
	Warmup time.Duration
	// CPUProfile, when set, receives a CPU profile of the offered load.
	CPUProfile string
	// Drain bounds the wait for the last answers after the load stops.
	// Prompts unanswered by then count with their age at the deadline, a
	// lower bound, so an overloaded pipeline shows in the percentiles
	// instead of dropping out of them. Defaults to 30s.
	Drain time.Duration
	// Kafka gives the run its broker. Defaults to an embedded broker of
	// its own.
	Kafka kafkaBackend
	// Text is every prompt's text. Defaults to promptText (no directive:
	// the scripted provider answers at once).
	Text string
	// Deltas publishes live deltas on session-deltas, as a consumer with
	// a streaming provider does. Defaults to false.
	Deltas bool
}

// percentiles in milliseconds.
type percentiles struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

func percentilesOf(d []time.Duration) percentiles {
	if len(d) == 0 {
		return percentiles{}
	}
	slices.Sort(d)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	at := func(q float64) float64 { return ms(d[min(len(d)-1, int(q*float64(len(d))))]) }
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return percentiles{N: len(d), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: ms(d[len(d)-1]), Mean: ms(sum / time.Duration(len(d)))}
}

// latencyResult is one end-to-end run.
type latencyResult struct {
	Sent         int     `json:"sent"`
	Measured     int     `json:"measured"`
	Completed    int     `json:"completed"`
	Failed       int     `json:"failed"`
	Missing      int     `json:"missing"`
	OfferedRate  float64 `json:"offered_per_second"`
	AchievedRate float64 `json:"achieved_per_second"`
	// CompletedRate is measured answers per second, from the first measured
	// send to the last answer seen: below the offered rate when the
	// pipeline falls behind.
	CompletedRate float64 `json:"completed_per_second"`
	// Admitted is send → input.admitted seen on session-events: the
	// admission half of the path.
	Admitted percentiles `json:"admitted"`
	// Turn is send → turn.completed seen: the end-to-end figure.
	Turn percentiles `json:"turn_completed"`
	// Stages splits the path by database timestamps.
	Stages []stage `json:"stages"`
	// Commits is the database's committed transactions during the run,
	// and per answered prompt (all components: admission, executor, relay).
	Commits          int64   `json:"commits"`
	CommitsPerPrompt float64 `json:"commits_per_prompt"`
	CPU              cpuUse  `json:"cpu"`
	// DeltasPublished counts the live deltas the broker acknowledged
	// (with Deltas only).
	DeltasPublished int64 `json:"deltas_published,omitempty"`
}

// measureLatency runs the full pipeline (relay, admitter, executor with the
// scripted provider, consumer group on prompts and wakes) on a fresh
// database and a fresh broker, offers Rate prompts per second for Duration,
// each to its own new session (so every prompt is one wake and one turn,
// and none queues behind another), and times each from the producer's send
// to a plain partition consumer of session-events seeing its
// turn.completed.
func measureLatency(ctx context.Context, sc *scratchServer, opts latencyOpts) (res latencyResult, err error) {
	if opts.Drain == 0 {
		opts.Drain = 30 * time.Second
	}
	brokers, release, err := freshBrokers(opts.Kafka, opts.Partitions)
	if err != nil {
		return res, err
	}
	defer release()
	db, err := sc.create(ctx, opts.Pool)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()

	cfg := kafkautil.NewConfig("bench-pipeline")
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return res, fmt.Errorf("connecting to the broker: %w", err)
	}
	defer client.Close()
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return res, fmt.Errorf("connecting relay producer: %w", err)
	}
	defer producer.Close()
	relay := outbox.NewRelay(db.Pool, producer, nil)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := relay.Start(runCtx); err != nil {
		return res, err
	}
	defer relay.Stop()
	admitter := admission.NewAdmitter(db.Pool, &admission.AdmitterConfig{OnCommitFunc: relay.Nudge})
	claims := ledger.NewClaims(db.Pool, &ledger.ClaimsConfig{OwnerID: "bench-" + db.Name})
	var deltas executor.DeltaSink
	if opts.Deltas {
		ap, err := sarama.NewAsyncProducer(brokers, executor.DeltaProducerConfig(cfg))
		if err != nil {
			return res, fmt.Errorf("connecting the deltas producer: %w", err)
		}
		var published atomic.Int64
		dp := executor.NewDeltaPublisher(ap, &executor.DeltaPublisherConfig{OnDeltaFunc: func(result string) {
			if result == "published" {
				published.Add(1)
			}
		}})
		defer func() {
			dp.Close()
			res.DeltasPublished = published.Load()
		}()
		deltas = dp
	}
	exec, err := executor.NewExecutor(db.Pool, &executor.ExecutorConfig{Claims: claims, OnCommitFunc: relay.Nudge, Deltas: deltas})
	if err != nil {
		return res, err
	}
	if err := exec.Start(ctx); err != nil {
		return res, err
	}
	defer exec.StopNow()
	handler := &joinSignal{
		ConsumerGroupHandler: pipeline.NewConsumer(admitter, exec, producer, &pipeline.ConsumerConfig{
			WakesPartitions: kafkautil.PartitionCount(client, kafkautil.Topics{}.WithDefaults().Wakes),
		}),
		joined: make(chan struct{}),
	}
	group, err := sarama.NewConsumerGroup(brokers, "bench-pipeline-"+db.Name, kafkautil.GroupConfig(cfg))
	if err != nil {
		return res, fmt.Errorf("creating consumer group: %w", err)
	}
	defer group.Close()

	tr := newTracker()
	events, err := readEvents(brokers, tr)
	if err != nil {
		return res, err
	}
	defer events.close()

	consumeErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { consumeErr <- consumeUntilDone(runCtx, group, []string{"prompts", "wakes"}, handler) })
	select {
	case <-handler.joined:
	case err := <-consumeErr:
		return res, fmt.Errorf("pipeline consumer: %w", err)
	case <-runCtx.Done():
		return res, context.Cause(runCtx)
	case <-time.After(time.Minute):
		return res, errors.New("consumer group did not join within a minute")
	}

	commits0, err := commitCount(ctx, db)
	if err != nil {
		return res, err
	}
	stopProfile := func() {}
	if opts.CPUProfile != "" {
		if stopProfile, err = startProfile(opts.CPUProfile); err != nil {
			return res, err
		}
	}
	c0 := sampleCPU()
	sent, sendSecs, err := offer(runCtx, brokers, tr, opts)
	stopProfile()
	if err != nil {
		return res, err
	}
	c1 := sampleCPU()
	deadline := tr.waitAll(runCtx, opts.Drain)
	commits1, err := commitCount(ctx, db)
	if err != nil {
		return res, err
	}

	lat := tr.results(deadline)
	// The pipeline keeps running while the stage timestamps are read: they
	// are all committed once the events were seen.
	st, err := stages(ctx, db.Pool, lat.ids, lat.sentAt)
	if err != nil {
		return res, err
	}
	res = latencyResult{
		Sent: sent, Measured: lat.measured, Completed: lat.completed, Failed: lat.failed,
		Missing:     lat.measured - lat.completed - lat.failed,
		OfferedRate: opts.Rate, AchievedRate: float64(sent) / sendSecs,
		Admitted: percentilesOf(lat.admitted), Turn: percentilesOf(lat.turn),
		Stages: st, CPU: cpuBetween(c0, c1), Commits: commits1 - commits0,
	}
	if n := sent - lat.unansweredAll; n > 0 {
		res.CommitsPerPrompt = float64(res.Commits) / float64(n)
	}
	if span := lat.lastAnswer.Sub(lat.firstMeasured).Seconds(); span > 0 {
		res.CompletedRate = float64(lat.completed) / span
	}
	return res, nil
}

// offer produces opts.Rate prompts per second for opts.Duration, paced
// open loop: at each millisecond tick it sends what is due by the clock,
// so a slow pipeline does not slow the offered load. It returns how many
// it sent and over how long.
func offer(ctx context.Context, brokers []string, tr *tracker, opts latencyOpts) (int, float64, error) {
	cfg := kafkautil.NewConfig("bench-load")
	producer, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("connecting load producer: %w", err)
	}
	var drained sync.WaitGroup
	var mu sync.Mutex
	var sendErr error
	drained.Go(func() {
		for range producer.Successes() {
		}
	})
	drained.Go(func() {
		for e := range producer.Errors() {
			mu.Lock()
			sendErr = cmpErr(sendErr, e.Err)
			mu.Unlock()
		}
	})
	defer func() {
		producer.AsyncClose()
		drained.Wait()
	}()

	run := uuid.Must(uuid.NewV7()).String()[:8]
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	warmEnd := start.Add(opts.Warmup)
	sent := 0
	for {
		elapsed := time.Since(start)
		if elapsed >= opts.Duration {
			break
		}
		due := int(elapsed.Seconds() * opts.Rate)
		for ; sent < due; sent++ {
			p := envelope.Prompt{
				MessageID: uuid.Must(uuid.NewV7()).String(),
				SessionID: "lat-" + run + "-" + strconv.Itoa(sent),
				Text:      cmp.Or(opts.Text, promptText),
			}
			v, err := envelope.Marshal(p)
			if err != nil {
				return sent, 0, err
			}
			now := time.Now()
			tr.sent(p.MessageID, now, now.After(warmEnd))
			select {
			case producer.Input() <- &sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(p.SessionID), Value: sarama.ByteEncoder(v)}:
			case <-ctx.Done():
				return sent, 0, ctx.Err()
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return sent, 0, ctx.Err()
		}
	}
	secs := time.Since(start).Seconds()
	mu.Lock()
	defer mu.Unlock()
	if sendErr != nil {
		return sent, secs, fmt.Errorf("producing prompts: %w", sendErr)
	}
	return sent, secs, nil
}

func cmpErr(old, new error) error {
	if old != nil {
		return old
	}
	return new
}

// tracker matches sends to the events that answer them.
type tracker struct {
	mu       sync.Mutex
	sentAtOf map[string]time.Time
	measured map[string]bool
	pending  int // measured prompts not yet answered
	admitted []time.Duration
	turn     []time.Duration
	failed   int
	// firstMeasured is the send time of the first measured prompt;
	// lastAnswer when the last answer to a measured prompt was seen.
	firstMeasured, lastAnswer time.Time
	// ids and sentAt list the measured prompts, for the stage breakdown.
	ids     []string
	sentAt  []time.Time
	changed chan struct{} // one-slot: an answer arrived
}

func newTracker() *tracker {
	return &tracker{sentAtOf: map[string]time.Time{}, measured: map[string]bool{}, changed: make(chan struct{}, 1)}
}

func (t *tracker) sent(id string, at time.Time, measure bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sentAtOf[id] = at
	if measure {
		if t.firstMeasured.IsZero() {
			t.firstMeasured = at
		}
		t.ids, t.sentAt = append(t.ids, id), append(t.sentAt, at)
		t.measured[id] = true
		t.pending++
	}
}

// seen records an event read at time at. The relay publishes at least
// once, so a repeated event is ignored: only the first sighting of a
// message's answer counts.
func (t *tracker) seen(e envelope.Event, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch e.Type {
	case envelope.EventInputAdmitted:
		if s, ok := t.sentAtOf[e.MessageID]; ok && t.measured[e.MessageID] {
			t.admitted = append(t.admitted, at.Sub(s))
		}
	case envelope.EventTurnCompleted, envelope.EventTurnFailed:
		for _, id := range e.MessageIDs {
			s, ok := t.sentAtOf[id]
			if !ok {
				continue
			}
			delete(t.sentAtOf, id)
			if !t.measured[id] {
				continue
			}
			t.pending--
			t.lastAnswer = at
			if e.Type == envelope.EventTurnFailed {
				t.failed++
			} else {
				t.turn = append(t.turn, at.Sub(s))
			}
		}
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
}

// outstanding is how many prompts, warm-up included, were sent and not
// yet answered: the turns in flight.
func (t *tracker) outstanding() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sentAtOf)
}

// waitAll waits until every measured prompt is answered, or drain passes,
// and returns when it stopped waiting.
func (t *tracker) waitAll(ctx context.Context, drain time.Duration) time.Time {
	deadline := time.NewTimer(drain)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		pending := t.pending
		t.mu.Unlock()
		if pending <= 0 {
			return time.Now()
		}
		select {
		case <-t.changed:
		case <-deadline.C:
			return time.Now()
		case <-ctx.Done():
			return time.Now()
		}
	}
}

type trackerResults struct {
	measured, failed          int
	completed                 int
	unansweredAll             int // sent, warm-up included, never answered
	admitted, turn            []time.Duration
	firstMeasured, lastAnswer time.Time
	ids                       []string
	sentAt                    []time.Time
}

// results lists the latencies; a measured prompt still unanswered at
// deadline counts with its age then (a lower bound of its latency).
func (t *tracker) results(deadline time.Time) trackerResults {
	t.mu.Lock()
	defer t.mu.Unlock()
	turn := slices.Clone(t.turn)
	for id, at := range t.sentAtOf {
		if t.measured[id] {
			turn = append(turn, deadline.Sub(at))
		}
	}
	return trackerResults{
		unansweredAll: len(t.sentAtOf),
		measured:      len(t.measured), failed: t.failed, completed: len(t.turn),
		admitted: slices.Clone(t.admitted), turn: turn,
		firstMeasured: t.firstMeasured, lastAnswer: t.lastAnswer,
		ids: slices.Clone(t.ids), sentAt: slices.Clone(t.sentAt),
	}
}

// eventReader reads session-events on every partition with a plain Sarama
// consumer (no group, nothing committed) and hands each event to the
// tracker with the time it was read.
type eventReader struct {
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
}

func readEvents(brokers []string, tr *tracker) (*eventReader, error) {
	c, err := sarama.NewConsumer(brokers, kafkautil.NewConfig("bench-events"))
	if err != nil {
		return nil, fmt.Errorf("connecting events reader: %w", err)
	}
	r := &eventReader{consumer: c}
	parts, err := c.Partitions("session-events")
	if err != nil {
		r.close()
		return nil, fmt.Errorf("listing session-events partitions: %w", err)
	}
	for _, p := range parts {
		pc, err := c.ConsumePartition("session-events", p, sarama.OffsetOldest)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("reading session-events/%d: %w", p, err)
		}
		r.pcs = append(r.pcs, pc)
		r.wg.Go(func() {
			for m := range pc.Messages() {
				at := time.Now()
				if e, err := envelope.DecodeEvent(m.Value); err == nil {
					tr.seen(e, at)
				}
			}
		})
		r.wg.Go(func() {
			for range pc.Errors() {
			}
		})
	}
	return r, nil
}

// close stops the partition consumers and waits for their readers.
func (r *eventReader) close() {
	for _, pc := range r.pcs {
		pc.AsyncClose()
	}
	r.wg.Wait()
	r.consumer.Close()
}

// commitCount reads the database's committed transactions. Postgres
// flushes backend statistics about once a second, so differences over a
// run of several seconds are exact to within a second's commits.
func commitCount(ctx context.Context, db *scratchDB) (int64, error) {
	var n int64
	err := db.Pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading commit count: %w", err)
	}
	return n, nil
}
