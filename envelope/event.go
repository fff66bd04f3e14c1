package envelope

import (
	"encoding/json"
	"time"
)

// Event types on the session-events topic.
const (
	EventInputAdmitted = "input.admitted"
	EventTurnCompleted = "turn.completed"
	EventTurnFailed    = "turn.failed"
	// EventRecoveryDecided: recovery took over an expired claim and decided
	// (Decision, Rule) what was safe.
	EventRecoveryDecided = "recovery.decided"
)

// Reasons of a failed turn (Event.Reason).
const (
	FailProviderError = "provider_error"
	FailUnsupported   = "unsupported"
	// FailInterrupted: promptline shut down during the turn. The provider
	// may have acted, so the turn is settled as failed, never retried.
	FailInterrupted = "interrupted"
	// FailOutcomeUnknown: the provider request may have been acted on and
	// no answer came; it is never replayed automatically.
	FailOutcomeUnknown = "outcome_unknown"
	// FailMaxSteps: the model asked for tools too many times in one turn.
	FailMaxSteps = "max_steps"
	// FailDeclined: a permission was declined; the turn stops.
	FailDeclined = "declined"
)

// Event is one session event, JSON on the session-events topic with Kafka
// key = session ID. ID is unique and stable: the outbox relay publishes at
// least once, so consumers deduplicate on it.
type Event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	SessionID string    `json:"session_id"`
	At        time.Time `json:"at"`

	// input.admitted
	MessageID string `json:"message_id,omitempty"`
	// turn.completed, turn.failed
	MessageIDs         []string `json:"message_ids,omitempty"`
	AssistantMessageID string   `json:"assistant_message_id,omitempty"`
	Text               string   `json:"text,omitempty"`
	// turn.failed
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`

	// recovery.decided
	ExecutionID           string `json:"execution_id,omitempty"`
	Decision              string `json:"decision,omitempty"`
	Rule                  string `json:"rule,omitempty"`
	ContinuationMessageID string `json:"continuation_message_id,omitempty"`
}

// Wake is the value of a message on the wakes topic, key = session ID. A
// wake is only a hint: Postgres holds the truth, so a lost or repeated wake
// costs latency, never correctness.
type Wake struct {
	SessionID string    `json:"session_id"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// DecodeEvent parses a session event.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	err := json.Unmarshal(b, &e)
	return e, err
}
