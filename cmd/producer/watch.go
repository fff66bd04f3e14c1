package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/cliconfig"
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
	deltas        bool
	deltasTopic   string

	view     *deltaView
	openStep string // the step whose deltas line is open, "" none
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

With --deltas it also reads the live text deltas (session-deltas) and prints a
turn as it streams: a step's deltas appended on one line as they come, then
the step.completed line, which is the truth (a delta of a step after its
step.completed is dropped; a new line for the same step means its text started
over, unless it begins with ... (it goes on after other lines). Deltas are not durable: a crash loses them, never the
answer. --type and --count apply to the events only.

Status lines (what is watched, consumer errors) go to standard error, events
to standard output.`,
		Example: `  producer watch --session s-1 --type turn.completed
  producer watch --from-beginning --json
  producer watch --session s-1 --type turn.completed --type turn.failed --count 1 --timeout 30s
  producer watch --session s-1 --deltas --type step.completed --type turn.completed`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.topic, "topic", "session-events", "topic to read; command line only: the shared topic setting is send's prompts topic")
	cliconfig.CommandLineOnly(f, "topic") // as reply's (reply.go)
	f.BoolVar(&o.fromBeginning, "from-beginning", false, "start at the oldest offsets (default: the newest offsets at start)")
	f.StringVar(&o.session, "session", "", "only events of this session")
	f.StringArrayVar(&o.types, "type", nil, "only events of this type (repeatable), e.g. turn.completed")
	f.IntVar(&o.count, "count", 0, "exit after this many matching events (0: no limit)")
	f.DurationVar(&o.timeout, "timeout", 0, "give up after this long; with --count, fail when fewer arrived (0: no limit)")
	f.BoolVar(&o.json, "json", false, "print each event as one raw JSON line")
	f.BoolVar(&o.deltas, "deltas", false, "also print the live text deltas of each step as they stream")
	f.StringVar(&o.deltasTopic, "deltas-topic", "session-deltas", "topic of the live deltas (with --deltas)")
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
	case o.deltas && o.deltasTopic == "":
		return errors.New("--deltas-topic: must not be empty")
	}
	if o.session != "" {
		if err := envelope.ValidSessionID(o.session, envelope.Limits{}); err != nil {
			return fmt.Errorf("--session: %w", err)
		}
	}
	for _, t := range o.types {
		if strings.TrimSpace(t) == "" {
			return errors.New("--type: must not be empty")
		}
		// A misspelt type would match nothing, and --count without
		// --timeout would wait for ever.
		if !slices.Contains(envelope.EventTypes, t) {
			return fmt.Errorf("--type: unknown event type %q; want one of %s", t, strings.Join(envelope.EventTypes, ", "))
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
	if o.deltas {
		// The step events settle deltas even when --type leaves them
		// unprinted: filter here, not in the Watcher.
		cfg.DeltasTopic = o.deltasTopic
		opts.Deltas, opts.Types = true, nil
		o.view = newDeltaView()
		defer o.endLine(stdout)
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
	if o.deltas {
		fmt.Fprintf(stderr, "and deltas on %s\n", o.deltasTopic)
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
		if r.Delta != nil {
			if err := o.printDelta(stdout, *r.Delta, r.Value); err != nil {
				return err
			}
			continue
		}
		if o.view != nil {
			o.view.event(r.Event)
			if len(o.types) > 0 && !slices.Contains(o.types, r.Event.Type) {
				continue
			}
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
		return writeCompact(w, raw, "event "+e.ID)
	}
	if err := o.endLine(w); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, formatEvent(e))
	return err
}

func writeCompact(w io.Writer, raw []byte, what string) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return fmt.Errorf("compacting %s: %w", what, err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// printDelta shows d as the rule of deltaView says: dropped, appended to
// the step's open line, or on a new line for the step, e.g.
//
//	s-1 deltas step=1 "Hello, wor
//
// which the next delta continues and the next other line closes with its
// quote; when another line came between, the step's text goes on on a
// line of its own marked with "..." before the quote. With --json a delta kept is its JSON on one line.
func (o *watchOpts) printDelta(w io.Writer, d envelope.Delta, raw []byte) error {
	act := o.view.delta(d)
	switch {
	case act == deltaIgnore:
		return nil
	case o.json:
		return writeCompact(w, raw, fmt.Sprintf("delta %s/%d", d.AssistantMessageID, d.Seq))
	case act == deltaAppend && o.openStep == d.AssistantMessageID:
		_, err := io.WriteString(w, quoteInner(d.Text))
		return err
	}
	if err := o.endLine(w); err != nil {
		return err
	}
	o.openStep = d.AssistantMessageID
	cont := "" // the step's text (re)starts
	if act == deltaAppend {
		cont = "..." // another line came between: the step's text goes on
	}
	_, err := fmt.Fprintf(w, "%s deltas step=%d %s\"%s", d.SessionID, d.Step, cont, quoteInner(d.Text))
	return err
}

// endLine closes an open deltas line.
func (o *watchOpts) endLine(w io.Writer) error {
	if o.openStep == "" {
		return nil
	}
	o.openStep = ""
	_, err := io.WriteString(w, "\"\n")
	return err
}

// quoteInner is strconv.Quote without the quotes: the pieces of a text
// quoted one by one concatenate to the quoted text.
func quoteInner(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
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
	case envelope.EventPermissionAsked:
		// What `producer reply --request` needs; never the call's input,
		// which may hold secrets.
		b.WriteString(" request_id=" + e.RequestID + " tool=" + e.Tool)
	case envelope.EventPermissionReplied:
		b.WriteString(" request_id=" + e.RequestID + " reply=" + e.Reply)
	case envelope.EventRecoveryDecided:
		b.WriteString(" decision=" + e.Decision)
		if e.Rule != "" {
			b.WriteString(" rule=" + e.Rule)
		}
		if e.ContinuationMessageID != "" {
			b.WriteString(" continuation=" + e.ContinuationMessageID)
		}
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
