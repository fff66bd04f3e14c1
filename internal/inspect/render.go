package inspect

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/promptline/promptline/internal/pgdb"
)

// Render writes the report for people: a header, then one section per
// table, aligned in columns, times in RFC 3339 UTC ("-infinity" or
// "infinity" for a value that is not a time), "none" (or "no claim")
// where a section is empty. Texts are printed indented below their
// message, with control characters escaped so that a prompt cannot drive
// the operator's terminal.
func Render(w io.Writer, r Report) error {
	p := &printer{w: w}
	tw := p.table()
	p.row(tw, "session", r.SessionID)
	p.row(tw, "state", r.State)
	p.row(tw, "fencing token", strconv.FormatInt(r.FencingToken, 10))
	p.row(tw, "created", ts(r.CreatedAt))
	p.row(tw, "last admitted", ts(r.LastAdmittedAt))
	p.row(tw, "redriven", tsp(r.RedrivenAt))
	p.row(tw, "read at", ts(pgdb.TimeOf(r.ReadAt)))
	p.flush(tw)

	p.section("INPUTS", len(r.Inputs))
	if len(r.Inputs) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  MESSAGE", "DELIVERY", "ADMITTED", "PROMOTED", "WAKE PENDING", "WAITING", "SOURCE", "QUARANTINE")
		for _, in := range r.Inputs {
			promoted := "no"
			if in.Promoted {
				promoted = "#" + strconv.FormatInt(*in.PromotionSeq, 10) + " " + tsp(in.PromotedAt)
			}
			p.row(tw, "  "+oneLine(in.MessageID), in.Delivery, "#"+strconv.FormatInt(in.AdmissionSeq, 10)+" "+ts(in.AdmittedAt),
				promoted, yesNo(in.WakePending), yesNo(in.Waiting), source(in), quarantine(in.QuarantineReason, in.QuarantinedAt))
		}
		p.flush(tw)
		// Promoted inputs are in the transcript; the others only here.
		for _, in := range r.Inputs {
			if !in.Promoted {
				p.line("  " + oneLine(in.MessageID) + " (not promoted):")
				p.text("    ", in.Text)
			}
		}
	}

	p.section("TRANSCRIPT", len(r.Transcript))
	if len(r.Transcript) == 0 {
		p.line("  none")
	}
	for _, m := range r.Transcript {
		head := fmt.Sprintf("  #%d %s %s  %s", m.Seq, m.Role, oneLine(m.MessageID), m.Status)
		switch m.Role {
		case "assistant":
			if len(m.Answers) > 0 {
				head += "  answers " + oneLine(strings.Join(m.Answers, ","))
			}
		case "tool":
			head += "  result of " + oneLine(deref(m.ToolCallID))
			if m.IsError {
				head += " (error)"
			}
		}
		head += "  " + tsp(m.CompletedAt)
		p.line(head)
		if m.Error != nil {
			p.line("    error: " + oneLine(*m.Error))
		}
		for _, part := range m.Parts {
			switch {
			case part.ToolCall != nil:
				c := part.ToolCall
				p.line("    tool call " + oneLine(c.ID) + " " + oneLine(c.Name) + " " + cut(oneLine(c.Input.Value), c.Input))
			default:
				if part.Malformed != nil {
					p.line("    malformed " + part.Kind + " part: " + oneLine(*part.Malformed))
				}
				if part.Text != nil {
					p.text("    ", *part.Text)
				}
			}
		}
	}

	p.section("CLAIM", -1)
	if c := r.Claim; c == nil {
		p.line("  no claim")
	} else {
		tw := p.table()
		expires := ts(c.ExpiresAt)
		if c.Expired {
			expires += " (expired)"
		}
		p.row(tw, "  execution", oneLine(c.ExecutionID))
		p.row(tw, "  owner", oneLine(c.OwnerID))
		p.row(tw, "  fencing token", strconv.FormatInt(c.FencingToken, 10))
		p.row(tw, "  phase", oneLine(c.Phase))
		p.row(tw, "  assistant message", oneLine(orDash(c.AssistantMessageID)))
		p.row(tw, "  acquired", ts(c.AcquiredAt))
		p.row(tw, "  renewed", ts(c.RenewedAt))
		p.row(tw, "  expires", expires)
		p.row(tw, "  quarantine", quarantine(c.QuarantineReason, c.QuarantinedAt))
		p.flush(tw)
	}

	p.section("ATTEMPTS", len(r.Attempts))
	if len(r.Attempts) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  ATTEMPT", "STEP", "PROVIDER", "MODEL", "STATE", "TRIES", "IDEMPOTENCY KEY", "TOKEN", "EST/IN/OUT TOKENS", "RESPONSE ID", "STARTED", "FINISHED", "ERROR")
		for _, a := range r.Attempts {
			p.row(tw, "  "+oneLine(a.AttemptID), strconv.Itoa(a.Step), oneLine(a.Provider), oneLine(orDash(a.Model)), a.State, strconv.Itoa(a.Tries),
				oneLine(a.IdempotencyKey), strconv.FormatInt(a.FencingToken, 10), num(a.RequestTokens)+"/"+num(a.InputTokens)+"/"+num(a.OutputTokens),
				oneLine(orDash(a.ResponseID)),
				ts(a.StartedAt), tsp(a.FinishedAt), oneLine(orDash(a.Error)))
		}
		p.flush(tw)
	}

	p.section("TOOL CALLS", len(r.ToolCalls))
	if len(r.ToolCalls) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  CALL", "TOOL", "CLASS", "STATE", "IDEMPOTENCY KEY", "TOKEN", "FINISHED", "OUTPUT")
		for _, c := range r.ToolCalls {
			out := "-"
			if c.Output != nil {
				out = strconv.Quote(c.Output.Value)
				if c.IsError != nil && *c.IsError {
					out = "error " + out
				}
				out = cut(out, *c.Output)
			}
			p.row(tw, "  "+oneLine(c.CallID), oneLine(c.Tool), c.Class, c.State, oneLine(c.IdempotencyKey),
				strconv.FormatInt(c.FencingToken, 10), tsp(c.FinishedAt), out)
		}
		p.flush(tw)
	}

	p.section("RECOVERIES", len(r.Recoveries))
	if len(r.Recoveries) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  EXECUTION", "PHASE FOUND", "DECISION", "RULE", "CONTINUATION", "TOKENS", "DECIDED", "SETTLED", "QUARANTINE")
		for _, d := range r.Recoveries {
			settled := "no"
			if d.Settled {
				settled = tsp(d.SettledAt)
			}
			p.row(tw, "  "+oneLine(d.ExecutionID), oneLine(d.PhaseFound), oneLine(d.Decision), oneLine(orDash(d.Rule)),
				oneLine(orDash(d.ContinuationMessageID)), fmt.Sprintf("%d→%d", d.TokenBefore, d.TokenAfter), ts(d.DecidedAt),
				settled, quarantine(d.QuarantineReason, nil))
		}
		p.flush(tw)
	}

	p.section("RESOLUTIONS", len(r.Resolutions))
	if len(r.Resolutions) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  TARGET", "ROUND", "KIND", "WAS", "FINDING", "BY", "RESOLVED", "CONTINUATION", "SETTLED", "OUTPUT", "NOTE")
		for _, d := range r.Resolutions {
			settled := "no"
			if d.Settled {
				settled = tsp(d.SettledAt)
			}
			output := "-"
			if d.Output != nil {
				output = cut(strconv.Quote(d.Output.Value), *d.Output)
			}
			p.row(tw, "  "+oneLine(d.TargetID), strconv.Itoa(d.Round), d.TargetKind, oneLine(d.StateBefore), d.Finding,
				oneLine(d.ResolvedBy), ts(d.ResolvedAt), oneLine(orDash(d.ContinuationMessageID)), settled, output,
				oneLine(orDash(d.Note)))
		}
		p.flush(tw)
	}

	p.section("PERMISSION REQUESTS", len(r.PermissionRequests))
	if len(r.PermissionRequests) == 0 {
		p.line("  none")
	} else {
		tw := p.table()
		p.row(tw, "  REQUEST", "TOOL", "STATUS", "REPLY", "ASKED", "REPLIED", "RESUMED", "MESSAGE")
		for _, q := range r.PermissionRequests {
			msg := "-"
			if q.Message != nil {
				msg = cut(strconv.Quote(q.Message.Value), *q.Message)
			}
			p.row(tw, "  "+oneLine(q.RequestID), oneLine(q.Tool), q.Status, oneLine(orDash(q.Reply)), ts(q.AskedAt),
				tsp(q.RepliedAt), tsp(q.ResumedAt), msg)
		}
		p.flush(tw)
	}
	if len(r.PermissionGrants) > 0 {
		p.line("  always allowed in this session:")
		for _, g := range r.PermissionGrants {
			p.line("    " + oneLine(g.Pattern) + " (request " + oneLine(g.RequestID) + ", " + ts(g.GrantedAt) + ")")
		}
	}
	return p.err
}

// printer keeps the first write error, so that Render checks once.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) line(s string) {
	if p.err == nil {
		_, p.err = io.WriteString(p.w, s+"\n")
	}
}

// section starts a section; n < 0 prints no count.
func (p *printer) section(title string, n int) {
	p.line("")
	if n >= 0 {
		title += " (" + strconv.Itoa(n) + ")"
	}
	p.line(title)
}

func (p *printer) table() *tabwriter.Writer {
	return tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)
}

func (p *printer) row(tw *tabwriter.Writer, cells ...string) {
	if p.err == nil {
		_, p.err = io.WriteString(tw, strings.Join(cells, "\t")+"\n")
	}
}

func (p *printer) flush(tw *tabwriter.Writer) {
	if err := tw.Flush(); err != nil && p.err == nil {
		p.err = err
	}
}

// text prints a bounded text line by line under indent, marking a cut.
func (p *printer) text(indent string, t Text) {
	lines := strings.Split(t.Value, "\n")
	for i, l := range lines {
		s := indent + "| " + escape(l)
		if i == len(lines)-1 && t.Truncated {
			s += fmt.Sprintf(" … [cut: %d of %d characters shown]", utf8Len(t.Value), t.Runes)
		}
		p.line(s)
	}
}

func cut(s string, t Text) string {
	if !t.Truncated {
		return s
	}
	return s + fmt.Sprintf(" … [cut: %d of %d characters shown]", utf8Len(t.Value), t.Runes)
}

func utf8Len(s string) int { return utf8.RuneCountInString(s) }

// escape keeps a line printable: control characters (ANSI escapes, carriage
// returns, tabs that would break the alignment) are shown escaped.
func escape(s string) string {
	if strings.IndexFunc(s, isControl) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' }

// oneLine is escape for a table cell: newlines too are escaped.
func oneLine(s string) string { return escape(s) }

func ts(t pgdb.Time) string { return t.UTC().Format(time.RFC3339) }

func tsp(t *pgdb.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func num(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

func source(in Input) string {
	if in.SourceTopic == nil {
		return "-"
	}
	s := oneLine(*in.SourceTopic)
	if in.SourcePartition != nil {
		s += "/" + strconv.Itoa(int(*in.SourcePartition))
	}
	if in.SourceOffset != nil {
		s += "@" + strconv.FormatInt(*in.SourceOffset, 10)
	}
	return s
}

func quarantine(reason *string, at *pgdb.Time) string {
	if reason == nil {
		return "-"
	}
	s := oneLine(*reason)
	if at != nil {
		s += " (" + ts(*at) + ")"
	}
	return s
}
