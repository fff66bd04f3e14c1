package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/metrics"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/pipeline"
	"github.com/promptline/promptline/recovery"
)

func setQuarantined(m *metrics.Metrics, counts map[string]int) {
	for kind, n := range counts {
		m.QuarantinedRows.WithLabelValues(kind).Set(float64(n))
	}
}

// atRiskGauge sets promptline_provider_tokens_at_risk from each pass's
// read of the attempts left unknown; a provider and model seen before and
// absent now falls back to 0 rather than vanishing. Only the recovery loop
// calls it.
type atRiskGauge struct {
	m    *metrics.Metrics
	seen map[[2]string]bool
}

func (g *atRiskGauge) set(atRisk []ledger.AtRisk) {
	now := map[[2]string]bool{}
	for _, a := range atRisk {
		now[[2]string{a.Provider, a.Model}] = true
		g.m.TokensAtRisk.WithLabelValues(a.Provider, a.Model).Set(float64(a.Tokens))
	}
	for k := range g.seen {
		if !now[k] {
			g.m.TokensAtRisk.WithLabelValues(k[0], k[1]).Set(0)
			now[k] = true
		}
	}
	g.seen = now
}

// heldDecisions are the labels of promptline_recovery_held, set to 0 when
// nothing waits so that a resumed fleet's gauge falls back.
var heldDecisions = []recovery.DecisionKind{recovery.DecisionCleared, recovery.DecisionSuperseded, recovery.DecisionRewoken,
	recovery.DecisionContinued, recovery.DecisionReconciled, recovery.DecisionQuarantined, recovery.DecisionRedriven}

func setHeld(m *metrics.Metrics, counts map[recovery.DecisionKind]int) {
	for _, d := range heldDecisions {
		m.RecoveryHeld.WithLabelValues(string(d)).Set(float64(counts[d]))
	}
}

func run(ctx context.Context, o *options, stderr io.Writer) (err error) {
	level, _ := parseLevel(o.logLevel)
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	// A signal may come at any step of the start; it stops the consumer as
	// at any other time, exit 0 (the deferred closes still run).
	running := false // set once the consumer runs: no error after that is a start's
	defer func() {
		if stoppedDuringStartup(ctx, err, running, log) {
			err = nil
		}
	}()
	// The first line: main's signal handlers are installed by now.
	log.Info("consumer starting")
	topics := o.topics.WithDefaults()

	brokers := o.brokers
	if len(brokers) == 0 {
		b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: o.embeddedKafkaAddr, Partitions: o.partitions})
		if err != nil {
			return fmt.Errorf("--embedded-kafka-addr: %w", err)
		}
		defer b.Close()
		brokers = []string{b.Addr()}
		log.Info("embedded Kafka broker started", slog.String("addr", b.Addr()))
	}

	// Every Kafka client of this process shares one configuration, TLS and
	// SASL applied (validate checked the settings already); the group's
	// differs only in its read timeout (kafkautil.GroupConfig).
	owner := "consumer-" + uuid.Must(uuid.NewV7()).String()
	cfg := kafkautil.NewConfig(owner)
	cfg.Producer.MaxMessageBytes = o.maxMessageBytes
	// --buffer-bytes is halved between Sarama's channel, which counts
	// messages at --max-value-bytes each, and admission's queue, which
	// counts their real sizes (pipeline.ConsumerConfig.BufferBytes).
	cfg.ChannelBufferSize = kafkautil.ChannelBufferFor(o.bufferBytes/2, o.maxValueBytes)
	if err := o.security.Apply(cfg); err != nil {
		return err
	}
	o.security.WarnPlaintext(ctx, log, brokers)

	// The clients dial through the watch, which cuts a stopped broker off
	// once the cluster has fenced it (kafkautil.BrokerWatch); the group's
	// client keeps the long read timeout its JoinGroup needs.
	watch := kafkautil.NewBrokerWatch(brokers, cfg, &kafkautil.BrokerWatchConfig{
		Topics: []string{topics.Prompts, topics.Wakes, topics.Events},
		Logger: log.With(slog.String("component", "kafka-watch")),
	})
	watch.Apply(cfg)
	groupCfg := kafkautil.GroupConfig(cfg)

	// Never shorter than the lease (ledger.ClaimsConfig.RoundTripTimeout
	// says why), the connections' TCP user timeout included.
	roundTrip := max(pgdb.RoundTripTimeoutFor(o.dbRoundTrip, o.dbTimeouts[0]), o.lease)
	db, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: o.databaseURL, Logger: log, MaxConns: o.dbMaxConns,
		StatementTimeout: o.dbTimeouts[0], LockTimeout: o.dbTimeouts[1], IdleInTxTimeout: o.dbTimeouts[2],
		RoundTripTimeout: roundTrip, NoMigrate: !o.migrate})
	if err != nil {
		return err
	}
	defer db.Close()

	reg := metrics.NewRegistry()
	m := metrics.New(reg)
	zeroSeries(m)
	ready, err := newReadiness(db.Pool)
	if err != nil {
		return err
	}
	ready.hung = watch.Hung
	if err := watch.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer watch.Stop()
	reg.MustRegister(metrics.NewScrapeCollector(&metrics.ScrapeConfig{
		DatabaseFunc: databaseStats(db.Pool), ReadyFunc: ready.Check,
	}))
	srv, err := metrics.Listen(o.metricsAddr, reg, &metrics.ServerConfig{ReadyFunc: ready.Check})
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	defer srv.Close()

	if o.createTopics {
		admin, err := awaitStart(ctx, func() (sarama.ClusterAdmin, error) {
			return sarama.NewClusterAdmin(brokers, cfg)
		}, func(a sarama.ClusterAdmin) { _ = a.Close() })
		if err != nil {
			return fmt.Errorf("connecting to Kafka %v: %w", brokers, o.security.Explain(err))
		}
		created, err := awaitStart(ctx, func() ([]string, error) {
			defer admin.Close()
			return kafkautil.EnsureTopics(admin, topics, o.partitions, o.replicationFactor, log)
		}, nil)
		if err != nil {
			return o.security.Explain(err)
		}
		if len(created) > 0 {
			log.Info("topics created", slog.Any("topics", created), slog.Int("partitions", int(o.partitions)))
		}
	}

	client, err := awaitStart(ctx, func() (sarama.Client, error) { return sarama.NewClient(brokers, cfg) },
		func(c sarama.Client) { _ = c.Close() })
	if err != nil {
		return fmt.Errorf("connecting to Kafka %v: %w", brokers, o.security.Explain(err))
	}
	defer client.Close()
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return fmt.Errorf("connecting producer to Kafka %v: %w", brokers, o.security.Explain(err))
	}
	defer producer.Close()

	relay := outbox.NewRelay(db.Pool, producer, &outbox.RelayConfig{
		MaxMessageBytes:  cfg.Producer.MaxMessageBytes,
		RoundTripTimeout: roundTrip,
		Logger:           log.With(slog.String("component", "relay")),
		OnPublished: func(n int, oldest time.Duration) {
			m.OutboxPublished.Add(float64(n))
			m.OutboxPublishDelay.Observe(oldest.Seconds())
		},
	})
	// The relay outlives the signal: turns finishing within the shutdown
	// grace, and their releases' wakes, commit outbox rows after it; its
	// Stop (deferred, so after the executor's Stop) publishes them.
	if err := relay.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer relay.Stop()
	if o.outboxRetention > 0 {
		pruner, err := outbox.NewPruner(db.Pool, &outbox.PrunerConfig{
			Retention: o.outboxRetention, Logger: log.With(slog.String("component", "outbox-pruner")),
			OnPruned: func(n int) { m.OutboxPruned.Add(float64(n)) },
		})
		if err != nil {
			return err
		}
		if err := pruner.Start(ctx); err != nil {
			return err
		}
		defer pruner.Stop()
	}
	if o.ledgerRetention > 0 {
		pruner, err := ledger.NewPruner(db.Pool, &ledger.PrunerConfig{
			Retention: o.ledgerRetention, Logger: log.With(slog.String("component", "ledger-pruner")),
			OnPruned: func(attempts, calls int) {
				m.LedgerPruned.WithLabelValues("attempts").Add(float64(attempts))
				m.LedgerPruned.WithLabelValues("tool_calls").Add(float64(calls))
			},
		})
		if err != nil {
			return err
		}
		if err := pruner.Start(ctx); err != nil {
			return err
		}
		defer pruner.Stop()
	}

	admitter := admission.NewAdmitter(db.Pool, &admission.AdmitterConfig{
		Topics: topics, OnCommitFunc: relay.Nudge,
		OnAdmittedFunc: func(outcomes []admission.Outcome, took time.Duration) {
			m.AdmissionBatchSize.Observe(float64(len(outcomes)))
			m.AdmissionSeconds.Observe(took.Seconds())
			for _, o := range outcomes {
				m.Admissions.WithLabelValues(o.String(), "").Inc()
			}
		},
	})
	provider, providerName, toolbox, cleanupTools, err := o.provider.build(ctx, log)
	if err != nil {
		return err
	}
	defer cleanupTools()
	var idempotentProviders []string
	if o.provider.idempotent {
		idempotentProviders = []string{providerName}
	}
	claims := ledger.NewClaims(db.Pool, &ledger.ClaimsConfig{
		Lease: o.lease, OwnerID: owner, Logger: log, RoundTripTimeout: roundTrip,
		OnFencedFunc:     m.FencedWrites.Inc,
		OnWriteRetryFunc: m.WriteRetries.Inc,
		OnRenewedFunc:    m.Claims.WithLabelValues("renewed").Inc,
	})
	// Live deltas go out with a producer of their own, straight, never
	// through the outbox: they are not durable, and a broken deltas topic
	// drops them (counted) without touching the turn.
	var deltas executor.DeltaSink
	// The providers that stream: openai when asked, and the scripted one,
	// whose /stream directive shows deltas on the demo's defaults.
	if o.provider.kind == "scripted" || o.provider.kind == "openai" && o.provider.openaiStream {
		ap, err := awaitStart(ctx, func() (sarama.AsyncProducer, error) {
			return sarama.NewAsyncProducer(brokers, executor.DeltaProducerConfig(cfg))
		}, func(p sarama.AsyncProducer) { _ = p.Close() })
		if err != nil {
			return fmt.Errorf("connecting the deltas producer to Kafka %v: %w", brokers, o.security.Explain(err))
		}
		dp := executor.NewDeltaPublisher(ap, &executor.DeltaPublisherConfig{Topic: topics.Deltas, Logger: log,
			OnDeltaFunc: func(result string) { m.Deltas.WithLabelValues(result).Inc() },
		})
		defer dp.Close()
		deltas = dp
	}
	exec, err := executor.NewExecutor(db.Pool, &executor.ExecutorConfig{
		Claims: claims, Topics: topics, MaxSessions: o.maxSessions, Logger: log, OnCommitFunc: relay.Nudge,
		Provider: provider, ProviderName: providerName, Tools: toolbox, PermissionFunc: o.permissions.lookup,
		ToolTimeout: o.toolTimeout, Deltas: deltas, StopGrace: o.shutdownGrace, MaxMessageBytes: cfg.Producer.MaxMessageBytes,
		OnClaimFunc:      func(event string) { m.Claims.WithLabelValues(event).Inc() },
		OnWakeFunc:       func(result string) { m.Wakes.WithLabelValues(result).Inc() },
		OnRunStartedFunc: m.ActiveExecutions.Inc,
		OnRunEndedFunc:   m.ActiveExecutions.Dec,
		OnTurnFunc: func(outcome string, sincePromotion time.Duration) {
			m.Turns.WithLabelValues(outcome).Inc()
			m.TurnSeconds.Observe(sincePromotion.Seconds())
		},
		OnAttemptFunc: func(outcome string, took time.Duration) {
			m.ProviderAttempts.WithLabelValues(outcome).Inc()
			m.ProviderSeconds.WithLabelValues(outcome).Observe(took.Seconds())
		},
		OnAttemptUnknownFunc: func(provider, model string) {
			m.AttemptsUnknown.WithLabelValues(provider, model).Inc()
		},
		OnResponseIDWriteFailedFunc: m.ResponseIDWriteFailures.Inc,
		OnToolRunFunc: func(outcome string, took time.Duration) {
			m.ToolCallSeconds.WithLabelValues(outcome).Observe(took.Seconds())
		},
		OnCallSettledFunc: func(outcome string) { m.ToolCalls.WithLabelValues(outcome).Inc() },
	})
	if err != nil {
		return err
	}
	// The executor outlives the signal too: its Stop, below, lets running
	// turns finish within the shutdown grace.
	if err := exec.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer exec.StopNow()
	recCfg := &recovery.Config{
		Interval: o.recoveryInterval, Batch: o.recoveryBatch, RedriveAfter: o.redriveAfter, RoundTripTimeout: roundTrip,
		OwnerID: owner, Topics: topics, Logger: log.With(slog.String("component", "recovery")),
		IdempotentProviders: idempotentProviders,
		OnDecisionFunc:      func(d recovery.DecisionKind) { m.RecoveryDecisions.WithLabelValues(string(d)).Inc() },
		OnRedriveFunc:       func(n int) { m.RedrivenWakes.Add(float64(n)) },
		OnQuarantinedFunc:   func(c map[string]int) { setQuarantined(m, c) },
		OnAttemptUnknownFunc: func(provider, model string) {
			m.AttemptsUnknown.WithLabelValues(provider, model).Inc()
		},
		OnAtRiskFunc:   (&atRiskGauge{m: m}).set,
		OnCommitFunc:   relay.Nudge,
		Mode:           o.recoveryMode,
		Rate:           o.recoveryRate,
		OnDeferredFunc: func(kind string, n int) { m.RecoveryDeferred.WithLabelValues(kind).Add(float64(n)) },
		OnHeldFunc:     func(c map[recovery.DecisionKind]int) { setHeld(m, c) },

		OnTransientErrorFunc: m.RecoveryTransient.Inc,
		OnCappedFunc:         m.RecoveryCapped.Inc,
	}
	o.recoveryCap.apply(recCfg)
	rec := recovery.New(db.Pool, recCfg)
	if err := rec.Start(ctx); err != nil {
		return err
	}
	defer rec.Stop()
	ccfg := &pipeline.ConsumerConfig{
		Topics: topics, MaxBatch: o.maxBatch, BufferBytes: max(o.bufferBytes/2, 1), MaxMessageBytes: o.maxMessageBytes, Logger: log, RoundTripTimeout: roundTrip,
		Limits: envelope.Limits{MaxValueBytes: o.maxValueBytes},
		// A prompt's published conflict is not reported: admission
		// counted it, as outcome conflict (each prompt is counted once, by
		// its classification).
		OnRejectFunc:      func(outcome, reason string) { m.Admissions.WithLabelValues(outcome, reason).Inc() },
		OnWakeFunc:        func(result string) { m.Wakes.WithLabelValues(result).Inc() },
		OnWakeStartedFunc: func(sinceAt time.Duration) { m.WakeToStart.Observe(sinceAt.Seconds()) },
	}
	// A consumed topic deleted and created again while this process runs
	// is read again from its oldest offset (pipeline.ConsumerConfig).
	ccfg.TopicIDsFunc = kafkautil.TopicIDs(client)
	ccfg.OldestOffsetFunc = kafkautil.OldestOffset(client)
	ccfg.CommittedMetadataFunc = kafkautil.CommittedMetadata(client, o.group)
	if o.localWakes {
		ccfg.WakesPartitions = kafkautil.PartitionCount(client, topics.Wakes)
	}
	handler := pipeline.NewConsumer(admitter, exec, producer, ccfg)

	// Readiness and per-partition lag, around the handler.
	observed := &observedHandler{ConsumerGroupHandler: handler, ready: ready, lag: m.ConsumerLag}

	group, err := awaitStart(ctx, func() (sarama.ConsumerGroup, error) {
		return sarama.NewConsumerGroup(brokers, o.group, groupCfg)
	}, func(g sarama.ConsumerGroup) { _ = g.Close() })
	if err != nil {
		return fmt.Errorf("joining consumer group %q: %w", o.group, o.security.Explain(err))
	}
	// Sarama's join does not watch ctx: a signal during a slow join (say,
	// while dead members' sessions time out) would wait for it. Closing
	// the group on the signal ends Consume, once the JoinGroup is answered
	// (see the grace below). Without a signal, the group is closed here.
	stopOnSignal := context.AfterFunc(ctx, func() { _ = group.Close() })
	defer func() {
		if stopOnSignal() {
			_ = group.Close()
		}
	}()
	go func() {
		for err := range group.Errors() {
			log.Warn("consumer group", slog.Any("error", err))
		}
	}()

	running = true
	log.Info("consumer running", slog.Any("brokers", brokers), slog.String("group", o.group),
		slog.String("metrics_addr", srv.Addr()), slog.String("owner", owner))
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for ctx.Err() == nil {
			// Consume returns at every rebalance; loop to rejoin.
			if err := group.Consume(ctx, []string{topics.Prompts, topics.Wakes, topics.PermissionReplies}, observed); err != nil {
				if errors.Is(err, sarama.ErrClosedConsumerGroup) || ctx.Err() != nil {
					return
				}
				log.Warn("consumer group session ended", slog.Any("error", err))
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
				}
			}
		}
	}()
	select {
	case <-consumed:
	case <-ctx.Done():
	}
	// Stop consuming first, then let running turns finish within the
	// grace; they release their claims with wakes where input waits; the
	// relay's Stop (deferred) flushes those wakes. The grace bounds the
	// group's stop too: a signal that comes while a JoinGroup waits (a
	// rebalance waits for every member to rejoin, up to the rebalance
	// timeout) ends Consume only when the broker answers it, and the
	// LeaveGroup of Close waits behind it on the same connection. Leaving
	// without waiting is safe: the broker drops the member at its session
	// timeout, and offsets not yet committed are redelivered as exact
	// retries.
	log.Info("consumer stopping", slog.Duration("grace", o.shutdownGrace))
	grace, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	select {
	case <-consumed:
	case <-grace.Done():
		log.Warn("consumer group still stopping when the shutdown grace ran out (a JoinGroup waits for a rebalance); exiting without it")
	}
	// One grace for the group's stop and the turns': when it ends, the
	// executor stops hard, whatever Stop's own grace has left.
	hard := context.AfterFunc(grace, exec.StopNow)
	exec.Stop()
	hard()
	log.Info("consumer stopped")
	return nil
}

// zeroSeries creates, at 0, the series of every outcome and decision the
// alert rules select on. A counter's series otherwise appears at its
// first increment, already at 1 or more, and rate() sees no increase in
// it: the first burst of uncertain outcomes after a start (a restarted
// process reconciling what its crash left) would never alert.
func zeroSeries(m *metrics.Metrics) {
	for _, o := range executor.Outcomes {
		m.ProviderAttempts.WithLabelValues(o)
		m.ToolCalls.WithLabelValues(o)
	}
	for _, d := range recovery.Decisions {
		m.RecoveryDecisions.WithLabelValues(string(d))
	}
}
