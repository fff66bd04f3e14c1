package eventsconsumer

import (
	"context"
	"slices"
	"sync"

	"github.com/promptline/promptline/envelope"
)

// ProgressTypes are the event types TurnProgress follows: pass them as
// Config.Types.
var ProgressTypes = []string{
	envelope.EventTurnStarted, envelope.EventStepCompleted, envelope.EventToolStarted,
	envelope.EventToolCompleted, envelope.EventTurnRecovered, envelope.EventTurnCompleted, envelope.EventTurnFailed,
}

// TurnProgress follows turns in progress from the step events, as a UI
// showing "step 2, running echo" would. It relies on what the contract
// says and nothing more: every fact has one id (repeats are already
// dropped by the router), and a turn's events come in commit order. A
// step.completed is the truth of its step; tool.completed ends the call
// that tool.started began. A continuation after a crash may start the
// same call again (same call_id, an id of its own), and a call may have
// more than one tool.completed (an operator's finding on an unknown
// outcome): the latest is its outcome.
type TurnProgress struct {
	mu    sync.Mutex
	turns map[string]*Turn // by turn_id
	byMsg map[string]string
}

// Turn is what TurnProgress knows of one turn.
type Turn struct {
	ID        string
	SessionID string
	// Steps is the number of the last completed step.
	Steps int
	// Text is the text of the completed steps, in order.
	Text []string
	// Running are the calls started and not yet completed (tool names by
	// call_id); Outcomes the completed ones'.
	Running   map[string]string
	Outcomes  map[string]string
	Recovered bool
	// Done is set by turn.completed or turn.failed (Reason then says why).
	Done   bool
	Reason string
}

// NewTurnProgress returns an empty tracker.
func NewTurnProgress() *TurnProgress {
	return &TurnProgress{turns: map[string]*Turn{}, byMsg: map[string]string{}}
}

// Handle is a HandleFunc.
func (p *TurnProgress) Handle(_ context.Context, e envelope.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := e.TurnID
	if id == "" && len(e.MessageIDs) > 0 {
		// turn.completed and turn.failed name the inputs, not the turn.
		id = p.byMsg[e.MessageIDs[0]]
	}
	if id == "" {
		return nil // a turn that started before this consumer did
	}
	t := p.turns[id]
	if t == nil {
		t = &Turn{ID: id, SessionID: e.SessionID, Running: map[string]string{}, Outcomes: map[string]string{}}
		p.turns[id] = t
	}
	for _, m := range e.MessageIDs {
		p.byMsg[m] = id
	}
	switch e.Type {
	case envelope.EventStepCompleted:
		t.Steps = max(t.Steps, e.Step)
		if e.Text != "" {
			t.Text = append(t.Text, e.Text)
		}
	case envelope.EventToolStarted:
		t.Running[e.CallID] = e.Tool
	case envelope.EventToolCompleted:
		delete(t.Running, e.CallID)
		t.Outcomes[e.CallID] = e.Outcome
	case envelope.EventTurnRecovered:
		t.Recovered = true
	case envelope.EventTurnCompleted, envelope.EventTurnFailed:
		t.Done, t.Reason = true, e.Reason
	}
	return nil
}

// Turn returns a copy of what is known of turn id.
func (p *TurnProgress) Turn(id string) (Turn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.turns[id]
	if !ok {
		return Turn{}, false
	}
	out := *t
	out.Text = slices.Clone(t.Text)
	out.Running = make(map[string]string, len(t.Running))
	for k, v := range t.Running {
		out.Running[k] = v
	}
	out.Outcomes = make(map[string]string, len(t.Outcomes))
	for k, v := range t.Outcomes {
		out.Outcomes[k] = v
	}
	return out, true
}
