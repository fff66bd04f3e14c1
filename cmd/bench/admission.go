package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/metrics"
	"github.com/promptline/promptline/pipeline"
)

// admissionOpts are the knobs of one admission run. The zero value is the
// shipped configuration.
type admissionOpts struct {
	Pool poolOpts
	// MaxBatch is pipeline.ConsumerConfig.MaxBatch. Defaults to the
	// pipeline's default (500).
	MaxBatch int
	// ChannelBuffer is Sarama's ChannelBufferSize: how many fetched
	// messages wait in a partition's channel, and so the most a batch can
	// take "already at hand" when admission's queue is empty. Defaults to
	// the consumer's at its default --buffer-bytes and --max-value-bytes
	// (half the buffer, kafkautil.ChannelBufferFor); admission's queue
	// gets the other half, as in the consumer.
	ChannelBuffer int
	// CPUProfile, when set, receives a CPU profile of the run.
	CPUProfile string
	// Timeout bounds the run. Defaults to 5 minutes.
	Timeout time.Duration
}

// admissionResult is one admission run.
type admissionResult struct {
	Prompts   int     `json:"prompts"`
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"prompts_per_second"`
	Batches   int     `json:"batches"`
	MeanBatch float64 `json:"mean_batch"`
	// MeanTxMillis is the mean latency of one Admit transaction.
	MeanTxMillis float64 `json:"mean_tx_ms"`
	CPU          cpuUse  `json:"cpu"`
}

// joinSignal wraps the pipeline's handler to learn when the group
// session starts: the clock of an admission run starts at the join, not
// at process start, so that broker connection and rebalance are not
// counted as admission time.
type joinSignal struct {
	sarama.ConsumerGroupHandler
	once   sync.Once
	joined chan struct{}
	cpu    atomic.Pointer[cpuSample]
}

func (j *joinSignal) Setup(s sarama.ConsumerGroupSession) error {
	j.once.Do(func() {
		c := sampleCPU()
		j.cpu.Store(&c)
		close(j.joined)
	})
	return j.ConsumerGroupHandler.Setup(s)
}

// measureAdmission runs the real admission path (pipeline.Consumer with
// an Admitter, in a Sarama consumer group on the prompts topic only) on a
// fresh database against a prompts topic already holding want prompts, and
// times it from the group join to the moment the inputs table holds them
// all. There is no executor and no relay: outbox rows are written (that is
// admission's cost) but nobody publishes them, so nothing competes with
// admission for the database.
func measureAdmission(ctx context.Context, sc *scratchServer, brokers []string, want int, opts admissionOpts) (res admissionResult, err error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	db, err := sc.create(ctx, opts.Pool)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, db.drop(ctx)) }()

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	cfg := kafkautil.NewConfig("bench-admission")
	cfg.ChannelBufferSize = cmp.Or(opts.ChannelBuffer, kafkautil.ChannelBufferFor(kafkautil.BufferBytesDefault/2, envelope.MaxValueBytesDefault))
	rejects, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return res, fmt.Errorf("connecting rejects producer: %w", err)
	}
	defer rejects.Close()
	admitter := admission.NewAdmitter(db.Pool, &admission.AdmitterConfig{
		OnAdmittedFunc: func(outcomes []admission.Outcome, took time.Duration) {
			m.AdmissionBatchSize.Observe(float64(len(outcomes)))
			m.AdmissionSeconds.Observe(took.Seconds())
			for _, o := range outcomes {
				m.Admissions.WithLabelValues(o.String(), "").Inc()
			}
		},
	})
	handler := &joinSignal{
		ConsumerGroupHandler: pipeline.NewConsumer(admitter, nil, rejects, &pipeline.ConsumerConfig{MaxBatch: opts.MaxBatch, BufferBytes: kafkautil.BufferBytesDefault / 2,
			OnRejectFunc: func(outcome, reason string) { m.Admissions.WithLabelValues(outcome, reason).Inc() },
		}),
		joined: make(chan struct{}),
	}
	group, err := sarama.NewConsumerGroup(brokers, "bench-admission-"+db.Name, kafkautil.GroupConfig(cfg))
	if err != nil {
		return res, fmt.Errorf("creating consumer group: %w", err)
	}
	defer group.Close()

	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	consumeErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, so run first)
	defer cancel()
	wg.Go(func() { consumeErr <- consumeUntilDone(runCtx, group, []string{"prompts"}, handler) })

	select {
	case <-handler.joined:
	case err := <-consumeErr:
		return res, fmt.Errorf("admission consumer: %w", err)
	case <-runCtx.Done():
		return res, fmt.Errorf("joining consumer group: %w", context.Cause(runCtx))
	}
	if opts.CPUProfile != "" {
		stop, err := startProfile(opts.CPUProfile)
		if err != nil {
			return res, err
		}
		defer stop()
	}
	c0 := *handler.cpu.Load()
	if err := waitCount(runCtx, db, "SELECT count(*) FROM inputs", want); err != nil {
		return res, fmt.Errorf("waiting for %d admitted prompts: %w", want, err)
	}
	c1 := sampleCPU()
	secs := c1.at.Sub(c0.at).Seconds()
	res = admissionResult{Prompts: want, Seconds: secs, Rate: float64(want) / secs, CPU: cpuBetween(c0, c1)}
	if h := histogram(m.AdmissionBatchSize); h.GetSampleCount() > 0 {
		res.Batches = int(h.GetSampleCount())
		res.MeanBatch = h.GetSampleSum() / float64(h.GetSampleCount())
	}
	if h := histogram(m.AdmissionSeconds); h.GetSampleCount() > 0 {
		res.MeanTxMillis = 1000 * h.GetSampleSum() / float64(h.GetSampleCount())
	}
	return res, nil
}

// consumeUntilDone runs a consumer group session after session (Consume
// returns at every rebalance) until ctx ends.
func consumeUntilDone(ctx context.Context, group sarama.ConsumerGroup, topics []string, h sarama.ConsumerGroupHandler) error {
	for ctx.Err() == nil {
		if err := group.Consume(ctx, topics, h); err != nil {
			if ctx.Err() != nil || errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return nil
			}
			return err
		}
	}
	return nil
}

// waitCount polls a count query every 10ms until it reaches want. The poll
// costs ~1ms of a 100,000-row count and bounds the timing error to one
// interval.
func waitCount(ctx context.Context, db *scratchDB, sql string, want int) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d: %w", n, want, context.Cause(ctx))
		case <-t.C:
		}
	}
}

func histogram(h prometheus.Histogram) *dto.Histogram {
	var out dto.Metric
	_ = h.Write(&out)
	return out.GetHistogram()
}

func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
