package envelope

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Delta is a fragment of a provider step's text as the provider streams
// it, JSON on the session-deltas topic with Kafka key = session ID
// (DeltaSchema, docs/session-events.md "Live deltas").
//
// Deltas are not durable: they are published straight from the process
// that runs the step, never through the outbox, and a crash, a full
// producer or a broken topic loses them. They are for display only; the
// step's durable text is the step.completed event with the same
// assistant_message_id, which a UI takes as the truth once it arrives.
type Delta struct {
	SessionID string `json:"session_id"`
	// TurnID is the turn's first assistant message ID, as on the step
	// events.
	TurnID string `json:"turn_id"`
	// AssistantMessageID is the step's assistant message, as on its
	// step.completed event.
	AssistantMessageID string `json:"assistant_message_id"`
	// Step numbers the turn's provider steps from 1, as on step.completed.
	Step int `json:"step"`
	// Seq numbers the deltas of one sending of the step from 1. Seq 1
	// (re)starts the step's text: a provider request sent again (after a
	// refusal such as 429) streams its text anew.
	Seq  int64     `json:"seq"`
	Text string    `json:"text"`
	At   time.Time `json:"at"`
}

// DecodeDelta parses a live delta. It requires what a reader needs to
// place the text: the step's assistant message and a seq from 1.
func DecodeDelta(b []byte) (Delta, error) {
	var d Delta
	if err := json.Unmarshal(b, &d); err != nil {
		return Delta{}, err
	}
	switch {
	case d.AssistantMessageID == "":
		return Delta{}, errors.New("delta: assistant_message_id: missing")
	case d.Seq < 1:
		return Delta{}, fmt.Errorf("delta: seq: want 1 or more, got %d", d.Seq)
	}
	return d, nil
}
