// Package eventsconsumer (directory examples/watermill) is a tested example
// of a Go service that reacts to promptline's session events with
// Watermill: a Router reading the session-events topic as a consumer
// group through watermill-kafka, one event at a time per partition,
// acknowledged after it was handled, with Retry and Recoverer middleware
// and deduplication on the event id. docs/session-events.md is the
// contract it reads.
//
// The package is not named watermill so that it can import Watermill
// without renaming it.
//
// # Running it against promptline
//
// Point it at the brokers promptline publishes to and give the service
// its own consumer group (one group per service: each group reads every
// event; the members of one group share the partitions):
//
//	router, err := eventsconsumer.NewEventsRouter(
//		func(ctx context.Context, e envelope.Event) error {
//			switch e.Type {
//			case envelope.EventTurnCompleted:
//				return notify(ctx, e.SessionID, e.Text)
//			case envelope.EventTurnFailed:
//				return notifyFailure(ctx, e.SessionID, e.Reason)
//			}
//			return nil
//		},
//		logger,
//		&eventsconsumer.Config{
//			Brokers: []string{"localhost:9092"},
//			Group:   "billing-notifier",
//			Types:   []string{envelope.EventTurnCompleted, envelope.EventTurnFailed},
//		},
//	)
//	if err != nil {
//		return err
//	}
//	// Run returns when ctx ends (a signal in main): the subscription
//	// stops and the router waits up to Config.CloseTimeout for running
//	// handlers. Router.Close does the same from elsewhere.
//	return router.Run(ctx)
//
// Against a local promptline, the brokers are 127.0.0.1:9092: `consumer`
// started without --brokers runs the embedded broker there, as does
// `consumer broker`. The group must be the service's own, never
// promptline's (--group, "promptline" by default): every start and stop
// of a member rebalances the whole group, and each group keeps its own
// committed offsets. A new group starts at the oldest offsets and so
// sees the events already on the topic; a restarted one resumes after the
// last event it acknowledged.
//
// Outside this module internal/kafkautil cannot be imported: pass
// Config.Sarama built from kafka.DefaultSaramaSubscriberConfig() with
// Version set to your brokers' (at least sarama.V0_11_0_0),
// Consumer.Offsets.Initial = sarama.OffsetOldest, and, unless Sarama's
// go-metrics are exported, metrics.UseNilMetrics = true
// (github.com/rcrowley/go-metrics) set once in main: Sarama's meters
// otherwise start a goroutine that never stops.
//
// # Turns in progress
//
// TurnProgress follows turns from the step events (turn.started,
// step.completed, tool.started, tool.completed, turn.recovered): pass
// its Handle as the HandleFunc and ProgressTypes as Config.Types. It
// needs nothing but the contract: one id per fact, commit order per turn.
//
// # Deduplication: the rule
//
// promptline publishes every event at least once, with a stable id; a
// consumer that must act once per event deduplicates on that id. Here an
// id counts as seen only after handle returned nil for it, so a failed
// event is retried rather than dropped.
//
// The set of seen ids in this example is in memory and bounded (the
// least recently used id is forgotten first). That is enough to drop the
// repeats the relay produces in normal operation, not enough for a
// service whose effect must happen once: after a restart, or when a
// rebalance moves a partition to another member, an event acknowledged
// by nobody yet (handled, then crashed before the offset was committed)
// is delivered again and the memory is gone. A real service deduplicates
// durably: it records the event id under a unique key in its own
// database in the same transaction as the effect (INSERT ... ON CONFLICT
// DO NOTHING; zero rows inserted means "already done", so skip). That
// is the same rule promptline applies to prompts, whose message id is the
// primary key of an admitted input. An effect outside the database
// (an email, a webhook) cannot share that transaction: send it with the
// event id as its idempotency key.
package eventsconsumer
