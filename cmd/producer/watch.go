package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
)

// watchOpts are the flags of the watch command.
type watchOpts struct {
	kafka         *kafkaOpts // persistent root flags
	topic         string
	fromBeginning bool
	session       string
	types         []string
	count         int
	timeout       time.Duration
	json          bool
}

func newWatchCommand(k *kafkaOpts) *cobra.Command {
	o := &watchOpts{kafka: k}
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print session events as they arrive",
		Long: `watch prints the session events promptline publishes, as they arrive, one line
per event (or the raw JSON with --json). It reads every partition with a plain
consumer: no consumer group, nothing committed. Events are published at least
once; a repeat of an event ID already seen is skipped.

With --count N it exits 0 after N matching events; with --timeout D as well,
it exits non-zero when fewer arrived within D. A --timeout alone ends the
watch after D.

Status lines (what is watched, consumer errors) go to standard error, events
to standard output.`,
		Example: `  producer watch --session s-1 --type turn.completed
  producer watch --from-beginning --json
  producer watch --session s-1 --type turn.completed --type turn.failed --count 1 --timeout 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "session-events", "topic to read")
	f.BoolVar(&o.fromBeginning, "from-beginning", false, "start at the oldest offsets (default: the newest offsets at start)")
	f.StringVar(&o.session, "session", "", "only events of this session")
	f.StringArrayVar(&o.types, "type", nil, "only events of this type (repeatable), e.g. turn.completed")
	f.IntVar(&o.count, "count", 0, "exit after this many matching events (0: no limit)")
	f.DurationVar(&o.timeout, "timeout", 0, "give up after this long; with --count, fail when fewer arrived (0: no limit)")
	f.BoolVar(&o.json, "json", false, "print each event as one raw JSON line")
	return cmd
}

// errWatchTimeout ends a watch at --timeout.
var errWatchTimeout = errors.New("--timeout")

func (o *watchOpts) run(ctx context.Context, stdout, stderr io.Writer) error {
	cfg, err := o.kafka.config("promptline-watch")
	if err != nil {
		return err
	}
	switch {
	case o.topic == "":
		return errors.New("--topic: must not be empty")
	case o.count < 0:
		return fmt.Errorf("--count: want 0 or more, got %d", o.count)
	case o.timeout < 0:
		return fmt.Errorf("--timeout: want 0 or more, got %s", o.timeout)
	}
	for _, t := range o.types {
		if strings.TrimSpace(t) == "" {
			return errors.New("--type: must not be empty")
		}
	}
	cfg.EventsTopic = o.topic
	opts := &client.WatchOpts{SessionID: o.session, Types: o.types, Start: client.StartNewest(),
		ErrorFunc: func(err error) {
			var derr *client.DecodeError
			if errors.As(err, &derr) {
				fmt.Fprintln(stderr, err)
				return
			}
			// Sarama retries on its own; say so, and keep watching.
			fmt.Fprintf(stderr, "consumer: %v\n", err)
		}}
	if o.fromBeginning {
		opts.Start = client.StartOldest()
	}
	w, err := client.NewWatcher(cfg, opts)
	if err != nil {
		return err
	}
	defer w.Close()
	if o.session != "" {
		fmt.Fprintf(stderr, "watching %s (partition %d of %d: session %s) from %s\n", o.topic, w.Partitions()[0], w.TopicPartitions(), o.session, w.Start())
	} else {
		fmt.Fprintf(stderr, "watching %s (%d partitions) from %s\n", o.topic, w.TopicPartitions(), w.Start())
	}

	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.timeout, errWatchTimeout)
		defer cancel()
	}
	matched := 0
	for o.count == 0 || matched < o.count {
		r, err := w.NextRecord(ctx)
		switch {
		case errors.Is(err, errWatchTimeout):
			if o.count > 0 {
				return fmt.Errorf("--timeout: %s passed with %d of %d matching events", o.timeout, matched, o.count)
			}
			return nil
		case err != nil && ctx.Err() != nil:
			if o.count > 0 {
				return fmt.Errorf("interrupted with %d of %d matching events", matched, o.count)
			}
			return nil
		case err != nil:
			return err
		}
		if err := o.print(stdout, r.Event, r.Value); err != nil {
			return err
		}
		matched++
	}
	return nil
}

func (o *watchOpts) print(w io.Writer, e envelope.Event, raw []byte) error {
	if o.json {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return fmt.Errorf("compacting event %s: %w", e.ID, err)
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	_, err := fmt.Fprintln(w, formatEvent(e))
	return err
}

// formatEvent renders one event on one line: session, type, then what the
// type carries, texts quoted (so a newline stays on the line), e.g.
//
//	s-1 turn.completed "echo: hello"
func formatEvent(e envelope.Event) string {
	var b strings.Builder
	b.WriteString(e.SessionID)
	b.WriteByte(' ')
	b.WriteString(e.Type)
	if e.MessageID != "" {
		b.WriteString(" message_id=" + e.MessageID)
	}
	switch e.Type {
	case envelope.EventStepCompleted:
		fmt.Fprintf(&b, " step=%d", e.Step)
		for _, c := range e.ToolCalls {
			b.WriteString(" call=" + c.Tool)
		}
	case envelope.EventToolStarted, envelope.EventToolCompleted:
		b.WriteString(" tool=" + e.Tool + " class=" + e.Class)
		if e.Outcome != "" {
			b.WriteString(" outcome=" + e.Outcome)
		}
	case envelope.EventTurnRecovered:
		b.WriteString(" continuation=" + e.ContinuationMessageID)
	}
	if e.Reason != "" {
		b.WriteString(" reason=" + e.Reason)
	}
	if e.Text != "" {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(e.Text))
	}
	if e.Error != "" {
		b.WriteString(" error=" + strconv.Quote(e.Error))
	}
	return b.String()
}
