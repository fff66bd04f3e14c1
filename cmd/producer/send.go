package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
)

// clientID names the producer to the brokers.
const clientID = "promptline-producer"

// sendOpts are the flags of the send command.
type sendOpts struct {
	kafka       *kafkaOpts // persistent root flags
	topic       string
	session     string
	text        string
	messageID   string
	delivery    string
	noResume    bool
	partitioner string
	file        string
}

func newSendCommand(k *kafkaOpts) *cobra.Command {
	o := &sendOpts{kafka: k}
	cmd := &cobra.Command{
		Use:   "send (--session S --text T | --file prompts.jsonl)",
		Short: "Publish one prompt, or every prompt of a JSON Lines file",
		Long: `send publishes prompt envelopes with Kafka key = session ID.

With --session and --text it publishes one envelope and prints
topic/partition/offset and the message ID. With --file it reads one envelope
JSON object per line ("-" reads standard input), validates every line as
promptline's admission will (a bad line stops everything before anything is
sent), then publishes them all, in file order per session.`,
		Example: `  producer send --session s-1 --text "hello"
  producer send --session s-1 --text "stop, use tabs" --delivery steer
  producer send --file prompts.jsonl --brokers kafka-1:9092,kafka-2:9092`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "prompts", "topic to publish to")
	f.StringVar(&o.session, "session", "", "session ID (the Kafka key)")
	f.StringVar(&o.text, "text", "", "prompt text")
	f.StringVar(&o.messageID, "message-id", "", "message ID, the idempotency key of the prompt (default a new UUIDv7)")
	f.StringVar(&o.delivery, "delivery", string(envelope.DeliveryQueue), "queue (its own turn, in order) or steer (joins the session's next turn)")
	f.BoolVar(&o.noResume, "no-resume", false, "admit the prompt without waking the session (resume: false)")
	f.StringVar(&o.partitioner, "partitioner", kafkautil.PartitionerMurmur2, "murmur2 (Java client, librdkafka murmur2_random) or fnv1a (Sarama's default)")
	f.StringVarP(&o.file, "file", "f", "", "JSON Lines file of envelopes, one per line; - for standard input")
	return cmd
}

func (o *sendOpts) run(cmd *cobra.Command) error {
	cfg, err := o.kafka.config(clientID)
	if err != nil {
		return err
	}
	cfg.PromptsTopic = o.topic
	if cfg.Partitioner, err = kafkautil.NewPartitioner(o.partitioner); err != nil {
		return fmt.Errorf("--partitioner: want %s or %s, got %q", kafkautil.PartitionerMurmur2, kafkautil.PartitionerFNV1a, o.partitioner)
	}
	if o.topic == "" {
		return errors.New("--topic: must not be empty")
	}
	if o.file != "" {
		for _, name := range []string{"session", "text", "message-id", "delivery", "no-resume"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s cannot be combined with --file: each line carries its own envelope", name)
			}
		}
		return o.sendFile(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg)
	}
	p, err := o.prompt(cmd)
	if err != nil {
		return err
	}
	return o.sendOne(cmd.Context(), cmd.OutOrStdout(), cfg, p)
}

// prompt builds the envelope from the flags and validates it with the rules
// admission applies, naming the flag at fault.
func (o *sendOpts) prompt(cmd *cobra.Command) (envelope.Prompt, error) {
	switch {
	case !cmd.Flags().Changed("session"):
		return envelope.Prompt{}, errors.New("--session is required (or --file)")
	case !cmd.Flags().Changed("text"):
		return envelope.Prompt{}, errors.New("--text is required (or --file)")
	case !utf8.ValidString(o.text):
		// json.Marshal would silently replace the bad bytes.
		return envelope.Prompt{}, errors.New("--text: not valid UTF-8")
	}
	p := envelope.Prompt{SessionID: o.session, Text: o.text, MessageID: o.messageID}
	switch d := envelope.Delivery(o.delivery); d {
	case envelope.DeliveryQueue, envelope.DeliverySteer:
		p.Delivery = d
	default:
		return envelope.Prompt{}, fmt.Errorf("--delivery: want queue or steer, got %q", o.delivery)
	}
	if !cmd.Flags().Changed("message-id") {
		p.MessageID = client.NewMessageID()
	}
	if o.noResume {
		p.Resume = new(false)
	}
	value, err := envelope.Marshal(p)
	if err != nil {
		return envelope.Prompt{}, fmt.Errorf("encoding the envelope: %w", err)
	}
	if _, err := envelope.Decode([]byte(p.SessionID), value, envelope.Limits{}); err != nil {
		var rej *envelope.RejectError
		if errors.As(err, &rej) {
			return envelope.Prompt{}, fmt.Errorf("%s: %w", flagOf(rej), err)
		}
		return envelope.Prompt{}, err
	}
	return p, nil
}

// flagOf names the flag behind a rejected envelope field.
func flagOf(rej *envelope.RejectError) string {
	switch {
	case strings.HasPrefix(rej.Detail, "message_id"):
		return "--message-id"
	case strings.HasPrefix(rej.Detail, "session_id"):
		return "--session"
	default: // text, or the size of the whole value, which the text dominates
		return "--text"
	}
}

func (o *sendOpts) sendOne(ctx context.Context, stdout io.Writer, cfg *client.Config, p envelope.Prompt) error {
	producer, err := client.NewProducer(cfg)
	if err != nil {
		return err
	}
	partition, offset, err := producer.Send(ctx, p)
	if cerr := producer.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s/%d/%d message_id=%s\n", o.topic, partition, offset, p.MessageID)
	return err
}
