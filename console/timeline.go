package console

import (
	"fmt"
	"sort"
	"time"

	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/recovery"
)

// Timeline is the drawing of one session's life: lanes of shapes on a
// shared time axis, laid out here and drawn by the timeline template as
// SVG (no script, no external font).
type Timeline struct {
	Width, Height int
	Lanes         []Lane
	Ticks         []Tick
	Shapes        []Shape
	Empty         bool
}

// Lane is one row: admissions, one execution, quarantine.
type Lane struct {
	Y     int
	Label string
}

// Tick is a mark of the time axis.
type Tick struct {
	X     int
	Label string
}

// Shape is one thing drawn: a bar (W > 0), a marker (W == 0) or a text.
// Class names what it is and its outcome (the stylesheet colours it);
// Title is its tooltip, Label a visible text beside it.
type Shape struct {
	X, Y, W, H int
	Kind       string // bar, marker, rule
	Class      string
	Title      string
	Label      string
	// End puts the label before the shape: it would run off the drawing.
	End bool
}

const (
	tlLeft    = 170 // the lanes' labels
	tlWidth   = 1000
	tlLaneH   = 46
	tlTop     = 34
	tlMinBarW = 4
)

// drawTimeline lays out a session: its admissions; per execution a bar
// from its first to its last durable trace (its attempts, tool calls and
// assistant messages; the current claim's acquisition and expiry; ended by
// a recovery's takeover), the provider attempts and tool calls inside it
// coloured by outcome, permission asks and replies, recovery decisions
// with the fencing token before and after; quarantines and releases.
//
// A time that is not a time ('-infinity', 'infinity': a hand edit) has no
// place on the axis: the axis spans the times, and such a value is drawn
// at its start or its end, its tooltip saying which value it is.
func drawTimeline(r inspect.Report, recs []recovery.Record, releases []inspect.Release) Timeline {
	type span struct {
		id         string
		start, end pgdb.Time
	}
	spans := map[string]*span{}
	var order []string
	see := func(exec string, ts ...*pgdb.Time) {
		if exec == "" {
			return
		}
		sp := spans[exec]
		for _, t := range ts {
			if t == nil || (t.IsFinite() && t.At.IsZero()) {
				continue
			}
			if sp == nil {
				sp = &span{id: exec, start: *t, end: *t}
				spans[exec] = sp
				order = append(order, exec)
			}
			if t.Compare(sp.start) < 0 {
				sp.start = *t
			}
			if t.Compare(sp.end) > 0 {
				sp.end = *t
			}
		}
	}
	var all []pgdb.Time
	for _, in := range r.Inputs {
		all = append(all, in.AdmittedAt)
		if in.QuarantinedAt != nil {
			all = append(all, *in.QuarantinedAt)
		}
	}
	for i := range r.Transcript {
		m := &r.Transcript[i]
		if m.Role == "assistant" && m.ExecutionID != nil {
			see(*m.ExecutionID, &m.CreatedAt, m.CompletedAt)
		}
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		see(a.ExecutionID, &a.StartedAt, a.FinishedAt)
	}
	for i := range r.ToolCalls {
		c := &r.ToolCalls[i]
		see(c.ExecutionID, &c.RequestedAt, c.StartedAt, c.FinishedAt)
	}
	for i := range recs {
		see(recs[i].ExecutionID, &recs[i].DecidedAt)
	}
	if c := r.Claim; c != nil {
		end := pgdb.TimeOf(r.ReadAt)
		if c.Expired || c.ExpiresAt.Compare(end) < 0 {
			end = c.ExpiresAt
		}
		see(c.ExecutionID, &c.AcquiredAt, &end)
		if c.QuarantinedAt != nil {
			see(c.ExecutionID, c.QuarantinedAt)
		}
	}
	callExec := map[string]string{}
	for _, c := range r.ToolCalls {
		callExec[c.CallID] = c.ExecutionID
	}
	for i := range r.PermissionRequests {
		p := &r.PermissionRequests[i]
		see(callExec[p.CallID], &p.AskedAt, p.RepliedAt)
	}
	for _, rel := range releases {
		all = append(all, rel.ReleasedAt)
	}
	for _, sp := range spans {
		all = append(all, sp.start, sp.end)
	}
	sort.SliceStable(order, func(i, j int) bool { return spans[order[i]].start.Compare(spans[order[j]].start) < 0 })

	lanes := 2 + len(order) // admissions, executions, quarantine
	t := Timeline{Width: tlWidth, Height: tlTop + lanes*tlLaneH + 24}
	if len(all) == 0 {
		t.Empty = true
		return t
	}
	var t0, t1 time.Time
	for _, x := range all {
		if !x.IsFinite() {
			continue
		}
		if t0.IsZero() || x.At.Before(t0) {
			t0 = x.At
		}
		if t1.IsZero() || x.At.After(t1) {
			t1 = x.At
		}
	}
	if t0.IsZero() {
		t0, t1 = r.ReadAt, r.ReadAt // no time at all: an axis of a second
	}
	total := t1.Sub(t0)
	if total <= 0 {
		total = time.Second
	}
	plot := tlWidth - tlLeft - 40
	x := func(at pgdb.Time) int {
		switch at.NotFinite {
		case pgdb.NegativeInfinity:
			return tlLeft
		case pgdb.Infinity:
			return tlLeft + plot
		}
		return tlLeft + int(float64(plot)*float64(at.At.Sub(t0))/float64(total))
	}
	laneY := func(i int) int { return tlTop + i*tlLaneH }
	for i := 0; i <= 4; i++ {
		at := t0.Add(total * time.Duration(i) / 4)
		t.Ticks = append(t.Ticks, Tick{X: x(pgdb.TimeOf(at)), Label: fmt.Sprintf("+%s", at.Sub(t0).Round(time.Millisecond))})
	}
	t.Ticks[0].Label = t0.UTC().Format("15:04:05.000Z")
	bar := func(y, h int, from, to pgdb.Time, class, title, label string) Shape {
		x0, x1 := x(from), x(to)
		if x1-x0 < tlMinBarW {
			x1 = x0 + tlMinBarW
		}
		return Shape{X: x0, Y: y, W: x1 - x0, H: h, Kind: "bar", Class: class, Title: title, Label: label}
	}
	marker := func(y int, at pgdb.Time, class, title, label string) Shape {
		return Shape{X: x(at), Y: y, Kind: "marker", Class: class, Title: title, Label: label}
	}

	t.Lanes = append(t.Lanes, Lane{Y: laneY(0), Label: "admissions"})
	for _, in := range r.Inputs {
		t.Shapes = append(t.Shapes, marker(laneY(0)+14, in.AdmittedAt, "admission",
			fmt.Sprintf("admitted %s (%s) at %s", in.MessageID, in.Delivery, in.AdmittedAt.Format(time.RFC3339Nano)), ""))
		if in.QuarantinedAt != nil {
			t.Shapes = append(t.Shapes, marker(laneY(lanes-1)+14, *in.QuarantinedAt, "quarantine",
				"input "+in.MessageID+" quarantined: "+deref(in.QuarantineReason), "quarantined"))
		}
	}
	laneOf := map[string]int{}
	for i, id := range order {
		laneOf[id] = i + 1
		sp := spans[id]
		y := laneY(i + 1)
		t.Lanes = append(t.Lanes, Lane{Y: y, Label: "execution " + short(id)})
		class, what := "claim", "execution "+id+": from its first to its last durable trace"
		for _, rec := range recs {
			if rec.ExecutionID == id {
				class, what = "claim expired", "execution "+id+": its claim expired and recovery took it over"
			}
		}
		if c := r.Claim; c != nil && c.ExecutionID == id {
			what = fmt.Sprintf("execution %s: claim (token %d, phase %s) acquired %s, lease until %s", id, c.FencingToken, c.Phase,
				c.AcquiredAt.Format(time.RFC3339Nano), c.ExpiresAt.Format(time.RFC3339Nano))
			if c.QuarantinedAt != nil {
				class = "claim quarantined"
			}
		}
		t.Shapes = append(t.Shapes, bar(y+4, 36, sp.start, sp.end, class, what, ""))
	}
	for i := range r.Attempts {
		a := &r.Attempts[i]
		end := spans[a.ExecutionID].end
		if a.FinishedAt != nil {
			end = *a.FinishedAt
		}
		label := ""
		if a.State == "unknown" || a.State == "started" {
			label = "attempt " + a.State
		}
		t.Shapes = append(t.Shapes, bar(laneY(laneOf[a.ExecutionID])+8, 12, a.StartedAt, end, "attempt "+a.State,
			fmt.Sprintf("provider attempt %s (step %d, %s): %s", a.AttemptID, a.Step, a.Provider, a.State), label))
	}
	for i := range r.ToolCalls {
		c := &r.ToolCalls[i]
		from := c.RequestedAt
		end := spans[c.ExecutionID].end
		if c.FinishedAt != nil {
			end = *c.FinishedAt
		}
		label := ""
		if c.State == "unknown" {
			label = "tool unknown"
		}
		t.Shapes = append(t.Shapes, bar(laneY(laneOf[c.ExecutionID])+24, 12, from, end, "tool "+c.State,
			fmt.Sprintf("tool call %s (%s, %s): %s", c.CallID, c.Tool, c.Class, c.State), label))
	}
	for _, p := range r.PermissionRequests {
		lane := laneOf[callExec[p.CallID]]
		t.Shapes = append(t.Shapes, marker(laneY(lane)+30, p.AskedAt, "permission asked", "permission asked for "+p.Tool+" ("+p.RequestID+")", ""))
		if p.RepliedAt != nil {
			t.Shapes = append(t.Shapes, marker(laneY(lane)+30, *p.RepliedAt, "permission replied "+p.Status,
				"permission "+p.Status+" ("+deref(p.Reply)+") for "+p.Tool, ""))
		}
	}
	for _, rec := range recs {
		y := laneY(laneOf[rec.ExecutionID])
		label := fmt.Sprintf("%s · token %d→%d", rec.Decision, rec.TokenBefore, rec.TokenAfter)
		t.Shapes = append(t.Shapes, Shape{X: x(rec.DecidedAt), Y: y, H: tlLaneH - 4, Kind: "rule", Class: "recovery " + string(rec.Decision),
			Title: fmt.Sprintf("recovery of %s found phase %q and decided %s; fencing token %d → %d", rec.ExecutionID, rec.PhaseFound, rec.Decision, rec.TokenBefore, rec.TokenAfter),
			Label: label})
	}
	qy := laneY(lanes - 1)
	t.Lanes = append(t.Lanes, Lane{Y: qy, Label: "quarantine"})
	if c := r.Claim; c != nil && c.QuarantinedAt != nil {
		t.Shapes = append(t.Shapes, marker(qy+14, *c.QuarantinedAt, "quarantine", "claim quarantined: "+deref(c.QuarantineReason), "claim quarantined"))
	}
	for _, rel := range releases {
		t.Shapes = append(t.Shapes, marker(qy+14, rel.ReleasedAt, "release",
			fmt.Sprintf("%s %s released by %s (was: %s)", rel.Kind, rel.Ref, rel.ReleasedBy, rel.Reason), "released"))
	}
	for i := range t.Shapes {
		if sh := &t.Shapes[i]; sh.Label != "" && sh.X+sh.W > tlWidth-200 {
			sh.End = true
		}
	}
	return t
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func short(id string) string {
	if len(id) > 18 {
		return id[:8] + "…" + id[len(id)-8:]
	}
	return id
}
