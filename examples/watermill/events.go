package eventsconsumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// HandleFunc reacts to one session event. It is called at most once per
// event ID that it handled successfully (see the package documentation for
// what "once" means across restarts); an error makes the router retry the
// same event, so return one only for a failure that a retry can fix.
type HandleFunc func(ctx context.Context, e envelope.Event) error

// Config configures NewEventsRouter.
type Config struct {
	// Brokers are the bootstrap addresses of the Kafka cluster promptline
	// publishes to. Required.
	Brokers []string
	// Group is the consumer group: the group's committed offsets are where
	// a restarted consumer resumes, and the partitions are shared among the
	// group's members. Required.
	Group string
	// Topic is the session-events topic. Defaults to "session-events".
	Topic string
	// Types limits HandleFunc to these event types; events of other types
	// are acknowledged without a call, so a type added to the contract
	// later is ignored as docs/session-events.md asks. Defaults to every
	// type.
	Types []string
	// Sarama is the client configuration. Defaults to kafkautil.NewConfig
	// (Kafka 3.6 protocol, oldest offsets for a new group, Sarama's
	// go-metrics off), with the group as client ID.
	Sarama *sarama.Config
	// MaxRetries bounds the retries of a failed HandleFunc call within one
	// delivery. Defaults to 3.
	MaxRetries int
	// RetryInterval is the first wait between retries; it doubles up to
	// 10 times its value. Defaults to 100ms.
	RetryInterval time.Duration
	// SeenIDs bounds the in-memory set of handled event IDs. Defaults to
	// 10000.
	SeenIDs int
	// CloseTimeout bounds how long Router.Close waits for running
	// handlers. Defaults to 30s.
	CloseTimeout time.Duration
}

func (c *Config) withDefaults() (*Config, error) {
	out := *c
	if len(out.Brokers) == 0 {
		return nil, errors.New("events router: Brokers is required")
	}
	if out.Group == "" {
		return nil, errors.New("events router: Group is required: without a consumer group nothing is committed and every restart re-reads the topic")
	}
	out.Topic = cmp.Or(out.Topic, "session-events")
	if out.Sarama == nil {
		out.Sarama = kafkautil.NewConfig(out.Group)
	}
	out.MaxRetries = cmp.Or(out.MaxRetries, 3)
	out.RetryInterval = cmp.Or(out.RetryInterval, 100*time.Millisecond)
	out.SeenIDs = cmp.Or(out.SeenIDs, 10000)
	out.CloseTimeout = cmp.Or(out.CloseTimeout, 30*time.Second)
	return &out, nil
}

// NewEventsRouter returns a Watermill Router that reads promptline's
// session events as a member of a consumer group and calls handle for
// each new event, one at a time per partition, acknowledging each after
// handle returned nil. Run it with Router.Run; Router.Close stops it and
// commits what was acknowledged.
//
// Watermill fits here and not inside promptline: watermill-kafka hands
// over one message at a time and tells the handler nothing about
// rebalances. promptline's admission batches and its executor must know
// which partitions it owns, so they use a Sarama ConsumerGroupHandler; a
// service that reacts to events one by one needs neither.
//
// What happens to an event:
//   - it does not decode, or has no id: logged and acknowledged. Retrying
//     cannot change its bytes, and holding the partition on it would stop
//     every later event of the sessions on that partition.
//   - its type is not in Config.Types: acknowledged.
//   - its id was handled before (the relay publishes at least once):
//     acknowledged without calling handle.
//   - otherwise handle is called. An error or a panic (Recoverer turns it
//     into an error) is retried up to Config.MaxRetries times with
//     backoff; if it still fails, the message is nacked and watermill-kafka
//     delivers it again, so the partition waits on it and a session's
//     events are never handled out of order. A service that would rather
//     skip such an event adds middleware.PoisonQueue with a publisher.
func NewEventsRouter(handle HandleFunc, logger *slog.Logger, config *Config) (*message.Router, error) {
	if handle == nil {
		return nil, errors.New("events router: handle is nil")
	}
	if config == nil {
		config = &Config{}
	}
	config, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	logger = cmp.Or(logger, slog.Default())
	wlogger := watermill.NewSlogLogger(logger)

	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               config.Brokers,
		Unmarshaler:           eventUnmarshaler{},
		OverwriteSaramaConfig: config.Sarama,
		ConsumerGroup:         config.Group,
	}, wlogger)
	if err != nil {
		return nil, fmt.Errorf("events router: kafka subscriber: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: config.CloseTimeout}, wlogger)
	if err != nil {
		return nil, fmt.Errorf("events router: %w", err)
	}
	// Middleware added first runs outermost: Retry sees the error that
	// Recoverer made of a panic, so a panicking handle is retried (and
	// then nacked) like a failing one instead of killing the process.
	router.AddMiddleware(
		middleware.Retry{
			MaxRetries:      config.MaxRetries,
			InitialInterval: config.RetryInterval,
			MaxInterval:     10 * config.RetryInterval,
			Multiplier:      2,
			// Each attempt runs on the delivery's context, which ends
			// when the router closes: a retry never outlives shutdown.
			Logger: wlogger,
		}.Middleware,
		middleware.Recoverer,
	)
	c := &eventsConsumer{
		handle: handle,
		logger: logger,
		seen:   newSeenIDs(config.SeenIDs),
		types:  slices.Clone(config.Types),
	}
	router.AddConsumerHandler("promptline-session-events", config.Topic, subscriber, c.consume)
	return router, nil
}

// eventsConsumer is the router's handler: decode, filter, deduplicate,
// handle.
type eventsConsumer struct {
	handle HandleFunc
	logger *slog.Logger
	seen   *seenIDs
	types  []string
}

func (c *eventsConsumer) consume(msg *message.Message) error {
	ctx := msg.Context()
	e, err := envelope.DecodeEvent(msg.Payload) // refuses a record without id or type
	if err != nil {
		c.logger.WarnContext(ctx, "skipping a message that is not a session event",
			slog.String("kafka", msg.UUID), slog.String("error", err.Error()))
		return nil
	}
	if len(c.types) > 0 && !slices.Contains(c.types, e.Type) {
		return nil
	}
	// Check, handle, then remember: an event whose handle failed must
	// not count as seen, or its redelivery would be dropped. Watermill's
	// Deduplicator middleware remembers before handling, which is why it
	// is not used here. Check and remember need no lock between them:
	// every copy of an event has the session as key, so all copies sit in
	// one partition, and a partition is handled one message at a time.
	if c.seen.contains(e.ID) {
		c.logger.DebugContext(ctx, "skipping a repeated event",
			slog.String("id", e.ID), slog.String("session_id", e.SessionID))
		return nil
	}
	if err := c.handle(ctx, e); err != nil {
		return fmt.Errorf("handling event %s of session %s: %w", e.ID, e.SessionID, err)
	}
	c.seen.add(e.ID)
	return nil
}

// eventUnmarshaler names each Watermill message after its Kafka record
// (topic/partition/offset), so that the router's logs point at it:
// promptline does not set watermill-kafka's UUID header, which would
// leave every message nameless. It never fails: watermill-kafka stops
// consuming the whole claim on an unmarshal error, so a bad value is left
// for the handler to skip.
type eventUnmarshaler struct{ kafka.DefaultMarshaler }

func (u eventUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	msg, err := u.DefaultMarshaler.Unmarshal(m)
	if err != nil {
		return nil, err
	}
	if msg.UUID == "" {
		msg.UUID = m.Topic + "/" + strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10)
	}
	return msg, nil
}

var _ kafka.Unmarshaler = eventUnmarshaler{}
