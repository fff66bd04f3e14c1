package main

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/cliconfig"
)

// replyOpts are the flags of the reply command.
type replyOpts struct {
	kafka   *kafkaOpts // persistent root flags
	topic   string
	session string
	request string
	message string
}

func newReplyCommand(k *kafkaOpts) *cobra.Command {
	o := &replyOpts{kafka: k}
	cmd := &cobra.Command{
		Use:   "reply --session S --request R once|always|reject [--message M]",
		Short: "Answer a permission request",
		Long: `reply answers the permission request R of session S (the request_id of its
permission.asked event) on the permission-replies topic, key = session ID:

  once    allow this call
  always  allow this call and, in this session, every later call of the tool
  reject  decline; with --message, the message goes back to the model as
          feedback and the turn goes on, without it the turn fails (declined)

The reply is validated as admission will before anything is sent, and it
prints topic/partition/offset, the request and the reply. Replies are
admitted once: the same reply again is a duplicate, another reply to an
answered request is rejected (conflict).`,
		Example: `  producer reply --session s-1 --request 0196a7c2-7b1e-7d4a-9c1e-1f2e3d4c5b6a once
  producer reply --session s-1 --request 0196a7c2-7b1e-7d4a-9c1e-1f2e3d4c5b6a reject --message "use the staging database"`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("want one reply, once, always or reject; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", client.RepliesTopicDefault, "topic to publish to (the consumer's --permission-replies-topic); command line only: the shared topic setting is send's prompts topic")
	// The shared `topic` setting (PROMPTLINE_TOPIC, a file's topic key)
	// is send's: the prompts topic. Read here, it would send the reply
	// into the prompts topic, where admission rejects it.
	cliconfig.CommandLineOnly(f, "topic")
	f.StringVar(&o.session, "session", "", "session ID of the request (the Kafka key)")
	f.StringVar(&o.request, "request", "", "request ID, the request_id of the permission.asked event")
	f.StringVar(&o.message, "message", "", "with reject: feedback handed back to the model")
	return cmd
}

func (o *replyOpts) run(cmd *cobra.Command, reply string) error {
	cfg, err := o.kafka.config(clientID)
	if err != nil {
		return err
	}
	switch {
	case o.topic == "":
		return errors.New("--topic: must not be empty")
	case o.session == "":
		return errors.New("--session is required")
	case o.request == "":
		return errors.New("--request is required")
	}
	switch reply {
	case envelope.ReplyOnce, envelope.ReplyAlways, envelope.ReplyReject:
	default:
		return fmt.Errorf("reply: want once, always or reject, got %q", reply)
	}
	if o.message != "" && reply != envelope.ReplyReject {
		return fmt.Errorf("--message goes only with reject, not with %s", reply)
	}
	// Validate before connecting, naming the flag at fault.
	if err := envelope.ValidSessionID(o.session, envelope.Limits{}); err != nil {
		return fmt.Errorf("--session: %w", err)
	}
	if !utf8.ValidString(o.message) {
		// json.Marshal would silently replace the bad bytes.
		return fmt.Errorf("--message: %s: not valid UTF-8", envelope.ReasonInvalidUTF8)
	}
	value, err := envelope.MarshalReply(envelope.PermissionReply{RequestID: o.request, Reply: reply, Message: o.message})
	if err != nil {
		return fmt.Errorf("encoding the reply: %w", err)
	}
	if _, err := envelope.DecodeReply(value, envelope.Limits{}); err != nil {
		var rej *envelope.RejectError
		if errors.As(err, &rej) {
			return fmt.Errorf("%s: %w", replyFlagOf(rej), rej)
		}
		return err
	}
	cfg.RepliesTopic = o.topic
	producer, err := client.NewProducer(cfg)
	if err != nil {
		return err
	}
	partition, offset, err := producer.Reply(cmd.Context(), o.session, o.request, reply, o.message)
	if cerr := producer.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s/%d/%d request_id=%s reply=%s\n", o.topic, partition, offset, o.request, reply)
	return err
}

// replyFlagOf names the flag behind a rejected reply field.
func replyFlagOf(rej *envelope.RejectError) string {
	if strings.HasPrefix(rej.Detail, "request_id") {
		return "--request"
	}
	return "--message"
}
