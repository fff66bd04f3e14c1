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
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

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

func (o *watchOpts) run(ctx context.Context, stdout, stderr io.Writer) error {
	brokers, cfg, err := o.kafka.config("promptline-watch")
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

	consumer, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", strings.Join(brokers, ","), o.kafka.security.Explain(err))
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(o.topic)
	if err != nil {
		return fmt.Errorf("listing the partitions of %s: %w", o.topic, err)
	}

	ctx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		pcs  []sarama.PartitionConsumer
		msgs = make(chan *sarama.ConsumerMessage)
		errc = make(chan error)
	)
	// Stop the forwarders first, then the partition consumers (Close drains
	// them), then the consumer (deferred above).
	defer func() {
		cancel()
		wg.Wait()
		for _, pc := range pcs {
			_ = pc.Close()
		}
	}()
	start, from := sarama.OffsetNewest, "newest"
	if o.fromBeginning {
		start, from = sarama.OffsetOldest, "oldest"
	}
	for _, p := range partitions {
		// ConsumePartition resolves OffsetNewest now, so every event
		// published after the status line below is seen.
		pc, err := consumer.ConsumePartition(o.topic, p, start)
		if err != nil {
			return fmt.Errorf("consuming %s/%d: %w", o.topic, p, err)
		}
		pcs = append(pcs, pc)
		wg.Go(func() { forward(ctx, pc, msgs, errc) })
	}
	fmt.Fprintf(stderr, "watching %s (%d partitions) from the %s offsets\n", o.topic, len(partitions), from)

	var timeout <-chan time.Time
	if o.timeout > 0 {
		timer := time.NewTimer(o.timeout)
		defer timer.Stop()
		timeout = timer.C
	}
	seen := make(map[string]struct{})
	matched := 0
	for o.count == 0 || matched < o.count {
		select {
		case m := <-msgs:
			e, err := envelope.DecodeEvent(m.Value)
			if err != nil {
				fmt.Fprintf(stderr, "skipping %s/%d/%d: not a session event: %v\n", m.Topic, m.Partition, m.Offset, err)
				continue
			}
			if e.SessionID == "" {
				e.SessionID = string(m.Key)
			}
			if !o.matches(e) {
				continue
			}
			if e.ID != "" {
				if _, dup := seen[e.ID]; dup {
					continue
				}
				seen[e.ID] = struct{}{}
			}
			if err := o.print(stdout, e, m.Value); err != nil {
				return err
			}
			matched++
		case err := <-errc:
			// Sarama retries on its own; say so, and keep watching.
			fmt.Fprintf(stderr, "consumer: %v\n", err)
		case <-timeout:
			if o.count > 0 {
				return fmt.Errorf("--timeout: %s passed with %d of %d matching events", o.timeout, matched, o.count)
			}
			return nil
		case <-ctx.Done():
			if o.count > 0 {
				return fmt.Errorf("interrupted with %d of %d matching events", matched, o.count)
			}
			return nil
		}
	}
	return nil
}

func (o *watchOpts) matches(e envelope.Event) bool {
	if o.session != "" && e.SessionID != o.session {
		return false
	}
	return len(o.types) == 0 || slices.Contains(o.types, e.Type)
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

// forward moves one partition's messages and errors onto the shared
// channels until ctx is done or the partition consumer closes.
func forward(ctx context.Context, pc sarama.PartitionConsumer, msgs chan<- *sarama.ConsumerMessage, errc chan<- error) {
	for {
		select {
		case m, ok := <-pc.Messages():
			if !ok {
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		case err, ok := <-pc.Errors():
			if !ok {
				return
			}
			select {
			case errc <- err:
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
