package client

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// Security is how the client authenticates to Kafka and protects the
// connection (TLS, SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or
// OAUTHBEARER), the same options the --tls and --sasl-* flags of
// promptline's commands set. The zero value is plaintext without
// authentication; certificates are always verified.
type Security = kafkautil.Security

// SASL mechanisms of Security.SASLMechanism.
const (
	SASLPlain       = kafkautil.SASLPlain
	SASLScramSHA256 = kafkautil.SASLScramSHA256
	SASLScramSHA512 = kafkautil.SASLScramSHA512
	SASLOAuthBearer = kafkautil.SASLOAuthBearer
)

// Default topic names, those of promptline's consumer.
const (
	PromptsTopicDefault = "prompts"
	EventsTopicDefault  = "session-events"
	RepliesTopicDefault = "permission-replies"
	DeltasTopicDefault  = "session-deltas"
)

const clientIDDefault = "promptline-client"

// Config configures a Producer or a Watcher. Only Brokers is required.
type Config struct {
	// Brokers are the Kafka bootstrap brokers, host:port. Required.
	Brokers []string
	// ClientID names the client to the brokers. Defaults to
	// "promptline-client".
	ClientID string
	// Security sets TLS and SASL. Defaults to plaintext without
	// authentication.
	Security Security
	// PromptsTopic is the topic prompts are sent to. Defaults to "prompts".
	PromptsTopic string
	// EventsTopic is the topic a Watcher reads. Defaults to
	// "session-events".
	EventsTopic string
	// DeltasTopic is the topic of live text deltas a Watcher reads beside
	// EventsTopic with WatchOpts.Deltas. Defaults to "session-deltas".
	DeltasTopic string
	// RepliesTopic is the topic permission replies are sent to. Defaults
	// to "permission-replies".
	RepliesTopic string
	// Partitioner chooses the partition of a record. Keep the default
	// unless you test what a misconfigured producer does: a session's
	// prompts must land on the partition every other producer (and
	// promptline's own relay) chooses. Defaults to NewMurmur2Partitioner.
	Partitioner sarama.PartitionerConstructor
	// Limits are the limits a prompt or reply is validated against before
	// it is sent; set them to the consumer's (--max-value-bytes) when it
	// runs with other limits. Defaults to admission's defaults
	// (envelope.Limits{}).
	Limits envelope.Limits
}

// withDefaults returns a copy of c with unset fields filled, and checks it.
func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, errors.New("client: a Config with Brokers is required")
	}
	out := *c
	out.Brokers = nil
	for _, b := range c.Brokers {
		if b = strings.TrimSpace(b); b != "" {
			out.Brokers = append(out.Brokers, b)
		}
	}
	if len(out.Brokers) == 0 {
		return Config{}, fmt.Errorf("client: Config.Brokers: want at least one host:port, got %q", c.Brokers)
	}
	out.ClientID = cmp.Or(out.ClientID, clientIDDefault)
	out.PromptsTopic = cmp.Or(out.PromptsTopic, PromptsTopicDefault)
	out.EventsTopic = cmp.Or(out.EventsTopic, EventsTopicDefault)
	out.RepliesTopic = cmp.Or(out.RepliesTopic, RepliesTopicDefault)
	out.DeltasTopic = cmp.Or(out.DeltasTopic, DeltasTopicDefault)
	if out.Partitioner == nil {
		out.Partitioner = NewMurmur2Partitioner
	}
	return out, nil
}

// sarama builds the Sarama configuration: promptline's (idempotent
// producer, acks=all, read_committed), with the security settings and the
// partitioner applied.
func (c *Config) sarama() (*sarama.Config, error) {
	sc := kafkautil.NewConfig(c.ClientID)
	if err := c.Security.Apply(sc); err != nil {
		return nil, fmt.Errorf("client: configuring Kafka security: %w", err)
	}
	sc.Producer.Partitioner = c.Partitioner
	return sc, nil
}

// connectError says what failed while connecting, with hints on the
// security settings to check.
func (c *Config) connectError(err error) error {
	return fmt.Errorf("connecting to %s: %w", strings.Join(c.Brokers, ","), c.Security.Explain(err))
}
