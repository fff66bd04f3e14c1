package main

import (
	"github.com/promptline/promptline/envelope"
)

// deltaAction is what watch --deltas does with one delta.
type deltaAction int

const (
	deltaIgnore  deltaAction = iota // the step's text is settled (or a repeat): drop it
	deltaAppend                     // more of the step's text
	deltaRestart                    // the step's text starts (over)
)

// deltaViewLimit bounds how many steps a deltaView remembers; the oldest
// are forgotten first (a delta that late has long been superseded).
const deltaViewLimit = 10_000

// deltaView applies the rule of docs/session-events.md "Live deltas" to a
// stream of deltas and events: deltas of a step are appended in seq
// order; seq 1 starts the step's text over; once the step's
// step.completed (or its turn's end) has been seen, later deltas of the
// step are dropped: step.completed is the truth.
type deltaView struct {
	steps map[string]*stepDeltas // by assistant message ID
	order []string               // the keys of steps, oldest first
}

type stepDeltas struct {
	turnID  string
	lastSeq int64
	settled bool
}

func newDeltaView() *deltaView { return &deltaView{steps: make(map[string]*stepDeltas)} }

func (v *deltaView) step(amid, turnID string) *stepDeltas {
	s, ok := v.steps[amid]
	if !ok {
		if len(v.order) >= deltaViewLimit {
			delete(v.steps, v.order[0])
			v.order = v.order[1:]
		}
		s = &stepDeltas{}
		v.steps[amid] = s
		v.order = append(v.order, amid)
	}
	if s.turnID == "" {
		s.turnID = turnID
	}
	return s
}

// delta says what to do with d.
func (v *deltaView) delta(d envelope.Delta) deltaAction {
	s, known := v.steps[d.AssistantMessageID]
	if !known {
		s = v.step(d.AssistantMessageID, d.TurnID)
		s.lastSeq = d.Seq
		// A step first seen past seq 1 (the watch started during it, or
		// deltas were lost) still shows what arrives.
		return deltaRestart
	}
	switch {
	case s.settled:
		return deltaIgnore
	case d.Seq == 1:
		s.lastSeq = 1
		return deltaRestart
	case d.Seq <= s.lastSeq: // a repeat or a straggler: already shown
		return deltaIgnore
	default:
		s.lastSeq = d.Seq
		return deltaAppend
	}
}

// event settles the steps e ends: a step.completed its step; a turn's
// end every step of the turn; a turn.recovered the steps of the turn that
// never completed (the continuation's steps come with new messages).
func (v *deltaView) event(e envelope.Event) {
	switch e.Type {
	case envelope.EventStepCompleted:
		v.step(e.AssistantMessageID, e.TurnID).settled = true
	case envelope.EventTurnCompleted, envelope.EventTurnFailed:
		if e.AssistantMessageID == "" {
			return
		}
		last := v.step(e.AssistantMessageID, "")
		last.settled = true
		v.settleTurn(last.turnID)
	case envelope.EventTurnRecovered:
		v.settleTurn(e.TurnID)
	}
}

func (v *deltaView) settleTurn(turnID string) {
	if turnID == "" {
		return
	}
	for _, s := range v.steps {
		if s.turnID == turnID {
			s.settled = true
		}
	}
}
