package replay

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/promptline/promptline/admission"
)

// Outcome classifies one replayed message.
type Outcome int

// The first three are admission's outcomes (admission.Classify decides
// them for prompts admitted before), so that an admission.Outcome converts.
const (
	// Admitted: a new input row (in a dry run: would be).
	Admitted = Outcome(admission.Admitted)
	// Duplicate: an exact retry of an admitted prompt; nothing new.
	Duplicate = Outcome(admission.Duplicate)
	// Conflict: the message ID is taken by another input; nothing changed.
	Conflict = Outcome(admission.Conflict)
)

const (
	// Malformed: envelope.Decode rejected the message.
	Malformed Outcome = Conflict + 1 + iota
	// Skipped: a message of the rejects topic that did not come from the
	// prompts topic (a rejected permission reply, say); not a prompt.
	Skipped
)

func (o Outcome) String() string {
	switch o {
	case Admitted, Duplicate, Conflict:
		return admission.Outcome(o).String()
	case Malformed:
		return "malformed"
	case Skipped:
		return "skipped"
	}
	return "unknown"
}

// Counts are the outcomes of a set of messages.
type Counts struct {
	Messages  int64 `json:"messages"`
	Bytes     int64 `json:"bytes"`
	Admitted  int64 `json:"admitted"`
	Duplicate int64 `json:"duplicate"`
	Conflict  int64 `json:"conflict"`
	Malformed int64 `json:"malformed"`
	Skipped   int64 `json:"skipped,omitempty"`
}

func (c *Counts) add(o Outcome) {
	switch o {
	case Admitted:
		c.Admitted++
	case Duplicate:
		c.Duplicate++
	case Conflict:
		c.Conflict++
	case Malformed:
		c.Malformed++
	case Skipped:
		c.Skipped++
	}
}

func (c *Counts) plus(o Counts) {
	c.Messages += o.Messages
	c.Bytes += o.Bytes
	c.Admitted += o.Admitted
	c.Duplicate += o.Duplicate
	c.Conflict += o.Conflict
	c.Malformed += o.Malformed
	c.Skipped += o.Skipped
}

// PartitionReport is the state of one partition's replay.
type PartitionReport struct {
	Range
	// First is the first offset replayed in this run; -1 when none.
	First int64 `json:"first_offset"`
	// Last is the last offset replayed in this run; -1 when none.
	Last int64 `json:"last_offset"`
	// Next is where a resumed replay starts: every offset before it is
	// durably classified.
	Next int64 `json:"next_offset"`
	Counts
}

// Done reports whether the partition's range is finished.
func (p PartitionReport) Done() bool { return p.Next >= p.To }

// Rejection is one message that was not admitted and why: malformed
// (envelope.Decode's reason), conflicting, or skipped.
type Rejection struct {
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Outcome   string `json:"outcome"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	MessageID string `json:"message_id,omitempty"`
	SessionID string `json:"session_id,omitempty"`
	// OriginalReason is the reason header of a message replayed from the
	// rejects topic: why it was rejected the first time.
	OriginalReason string `json:"original_reason,omitempty"`
	// Source is where a message replayed from the rejects topic first
	// arrived (its source_* headers), as topic/partition/offset.
	Source string `json:"source,omitempty"`
}

// Report is the result of a replay run.
type Report struct {
	Topic       string    `json:"topic"`
	DryRun      bool      `json:"dry_run"`
	Wake        bool      `json:"wake"`
	Interrupted bool      `json:"interrupted"`
	Complete    bool      `json:"complete"`
	StartedAt   time.Time `json:"started_at"`
	Seconds     float64   `json:"seconds"`
	// Rate is messages per second over the run.
	Rate   float64 `json:"messages_per_second"`
	Totals Counts  `json:"totals"`
	// Reasons counts rejections (malformed, conflict, skipped) by reason.
	Reasons    map[string]int64  `json:"reasons"`
	Partitions []PartitionReport `json:"partitions"`
	// Rejections lists rejected messages, the first Config.MaxRejections.
	Rejections        []Rejection `json:"rejections"`
	RejectionsOmitted int64       `json:"rejections_omitted,omitempty"`
}

// Resume is the state from which a later run continues: every partition
// from its next offset to the end of its range.
func (r *Report) Resume() ResumeState {
	st := ResumeState{Topic: r.Topic}
	for _, p := range r.Partitions {
		st.Ranges = append(st.Ranges, Range{Partition: p.Partition, From: p.Next, To: p.To})
	}
	return st
}

// NextOffsets maps each unfinished partition to its next offset.
func (r *Report) NextOffsets() map[int32]int64 {
	out := map[int32]int64{}
	for _, p := range r.Partitions {
		if !p.Done() {
			out[p.Partition] = p.Next
		}
	}
	return out
}

// EndOffsets maps each unfinished partition to the end of its range.
func (r *Report) EndOffsets() map[int32]int64 {
	out := map[int32]int64{}
	for _, p := range r.Partitions {
		if !p.Done() {
			out[p.Partition] = p.To
		}
	}
	return out
}

// WriteText prints the report for people.
func (r *Report) WriteText(w io.Writer) error {
	mode := ""
	if r.DryRun {
		mode = " (dry run: nothing written; admitted = would be admitted)"
	}
	state := "complete"
	if r.Interrupted {
		state = "interrupted"
	} else if !r.Complete {
		state = "stopped early"
	}
	t := r.Totals
	fmt.Fprintf(w, "replay of %s %s%s: %d messages (%s) in %.1fs, %.0f/s\n", r.Topic, state, mode,
		t.Messages, formatBytes(t.Bytes), r.Seconds, r.Rate)
	fmt.Fprintf(w, "admitted %d, duplicate %d, conflict %d, malformed %d", t.Admitted, t.Duplicate, t.Conflict, t.Malformed)
	if t.Skipped > 0 {
		fmt.Fprintf(w, ", skipped %d", t.Skipped)
	}
	fmt.Fprintln(w)
	if !r.Wake && !r.DryRun && t.Admitted > 0 {
		fmt.Fprintln(w, "admitted without a wake (no --wake): the sessions do not run until woken")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "partition\trange\tfirst\tlast\tnext\tmessages\tadmitted\tduplicate\tconflict\tmalformed\t")
	off := func(n int64) string {
		if n < 0 {
			return "-"
		}
		return fmt.Sprint(n)
	}
	for _, p := range r.Partitions {
		fmt.Fprintf(tw, "%d\t[%d,%d)\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", p.Partition, p.From, p.To, off(p.First), off(p.Last),
			p.Next, p.Messages, p.Admitted, p.Duplicate, p.Conflict, p.Malformed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Reasons) > 0 {
		fmt.Fprint(w, "rejected by reason:")
		for _, k := range slices.Sorted(maps.Keys(r.Reasons)) {
			fmt.Fprintf(w, " %s=%d", k, r.Reasons[k])
		}
		fmt.Fprintln(w)
	}
	for _, j := range r.Rejections {
		fmt.Fprintf(w, "  %s/%d/%d %s %s: %s", r.Topic, j.Partition, j.Offset, j.Outcome, j.Reason, j.Detail)
		if j.OriginalReason != "" {
			fmt.Fprintf(w, " (first rejected: %s, from %s)", j.OriginalReason, j.Source)
		}
		fmt.Fprintln(w)
	}
	if r.RejectionsOmitted > 0 {
		fmt.Fprintf(w, "  … and %d more (raise --max-rejections, or use --json)\n", r.RejectionsOmitted)
	}
	return nil
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// FormatBytes renders a byte count for progress lines.
func FormatBytes(n int64) string { return formatBytes(n) }
