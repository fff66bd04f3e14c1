package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"time"
	"unicode/utf8"
)

// Event types on the session-events topic.
const (
	EventInputAdmitted = "input.admitted"
	EventTurnCompleted = "turn.completed"
	EventTurnFailed    = "turn.failed"
	// EventRecoveryDecided: recovery took over an expired claim and decided
	// (Decision, Rule) what was safe.
	EventRecoveryDecided = "recovery.decided"
	// EventPermissionAsked: a tool call needs approval; the session is
	// parked until a reply arrives on the permission-replies topic.
	EventPermissionAsked = "permission.asked"
	// EventPermissionReplied: a reply was admitted; the session resumes.
	EventPermissionReplied = "permission.replied"

	// Step events: a turn in progress, each committed with the fact it
	// announces (docs/session-events.md).

	// EventTurnStarted: inputs were promoted; a turn (TurnID) answers them.
	EventTurnStarted = "turn.started"
	// EventStepCompleted: a provider step's response is durable: its text
	// and the tool calls it requested.
	EventStepCompleted = "step.completed"
	// EventToolStarted: a tool call's intent is committed; it is dispatched.
	EventToolStarted = "tool.started"
	// EventToolCompleted: a tool call's outcome is committed.
	EventToolCompleted = "tool.completed"
	// EventTurnRecovered: recovery continued a turn that a crashed or
	// paused process left (a continuation input follows).
	EventTurnRecovered = "turn.recovered"
)

// EventTypes lists the event types above (session-event.schema.json has
// one branch for each).
var EventTypes = []string{
	EventInputAdmitted, EventTurnStarted, EventStepCompleted, EventToolStarted, EventToolCompleted,
	EventTurnCompleted, EventTurnFailed, EventTurnRecovered, EventRecoveryDecided,
	EventPermissionAsked, EventPermissionReplied,
}

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

	// permission.asked, permission.replied
	RequestID string          `json:"request_id,omitempty"`
	Tool      string          `json:"tool,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Reply     string          `json:"reply,omitempty"`

	// turn.started, step.completed, tool.*, turn.recovered: the turn, named
	// after its first assistant message.
	TurnID string `json:"turn_id,omitempty"`
	// step.completed: the step's number in its turn (from 1) and the calls
	// it requested.
	Step      int             `json:"step,omitempty"`
	ToolCalls []EventToolCall `json:"tool_calls,omitempty"`
	// tool.started, tool.completed (Tool above names the tool). The
	// call's input and output are not carried: they may hold secrets; the
	// transcript has them.
	CallID      string `json:"call_id,omitempty"`
	ModelCallID string `json:"model_call_id,omitempty"`
	Class       string `json:"class,omitempty"`
	// tool.completed: succeeded, failed, unknown or interrupted (the
	// ledger's terminal call states).
	Outcome string `json:"outcome,omitempty"`

	// Truncated: Text or Error is cut short, Input left out, or
	// ToolCalls cut to the first ones, so that the event fits in one
	// Kafka message (MarshalWithin); the transcript holds the whole.
	Truncated bool `json:"truncated,omitempty"`
}

// MarshalWithin returns e as JSON of at most limit bytes (no bound when
// limit is 0 or less). What an event carries from outside (a model's answer, an
// error's text, a tool call's input) has no bound of its own, and an
// event larger than the topic takes could never be published: its
// watchers would never see the turn end, or the ask its session waits on.
// So when e does not fit, Input is left out (cut JSON is no JSON), then
// ToolCalls are cut to the first ones, one at least (a step of thousands
// of calls; each has tool.started and tool.completed of its own), then Text and Error are
// cut at a character boundary, the longer first, until it fits, and
// Truncated says so. An event that still does not fit (its IDs alone are
// too many) is returned whole: the relay quarantines it.
//
// Strings are written as they are, not with HTML's <, > and & escaped
// (json.Marshal's default), which would make an answer full of markup six
// times its size; the JSON value is the same.
func (e Event) MarshalWithin(limit int) []byte {
	b := marshalEvent(e)
	if limit <= 0 || len(b) <= limit {
		return b
	}
	e.Truncated, e.Input = true, nil
	for {
		b = marshalEvent(e)
		over := len(b) - limit
		if over <= 0 {
			return b
		}
		if n := len(e.ToolCalls); n > 1 {
			// Drop calls worth what is over, at their average size, and one
			// more: at least one call a round. The first call is kept:
			// tool_calls absent says the step asked for none (its answer,
			// turn.completed next), so the text is cut instead.
			calls, _ := json.Marshal(e.ToolCalls)
			drop := min(n-1, over/max(1, len(calls)/n)+1)
			e.ToolCalls = e.ToolCalls[: n-drop : n-drop]
			continue
		}
		long, short := &e.Text, &e.Error
		if len(e.Error) > len(e.Text) {
			long, short = short, long
		}
		if *long == "" {
			return b
		}
		// Each byte cut takes at least one byte of JSON with it. The
		// longer member is cut first, down to the shorter's length at
		// most, then each by half of what is over, so that both keep a
		// part when both are long.
		*long = cutEnd(*long, min(over, max(len(*long)-len(*short), (over+1)/2)))
	}
}

// marshalEvent is e as JSON, HTML's characters unescaped.
func marshalEvent(e Event) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(e) // an Event always marshals
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// cutEnd returns s without at least its last n bytes, cut before a
// character.
func cutEnd(s string, n int) string {
	if n >= len(s) {
		return ""
	}
	i := len(s) - n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// EventToolCall is a tool call a step requested (step.completed), without
// its input.
type EventToolCall struct {
	// CallID is promptline's ID of the call (tool.started and
	// tool.completed carry it); ModelCallID the model's.
	CallID      string `json:"call_id"`
	ModelCallID string `json:"model_call_id"`
	Tool        string `json:"tool"`
	Class       string `json:"class"`
}

// Wake is the value of a message on the wakes topic, key = session ID. A
// wake is only a hint: Postgres holds the truth, so a lost or repeated wake
// costs latency, never correctness.
type Wake struct {
	SessionID string    `json:"session_id"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// DecodeEvent parses a session event. Every event has an id and a type
// (docs/session-events.md): a JSON object without them (a prompt, a wake,
// another producer's record on the topic) is no session event, and is
// refused rather than returned as an empty one.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return e, err
	}
	switch {
	case e.ID == "":
		return e, errors.New("not a session event: no id")
	case e.Type == "":
		return e, errors.New("not a session event: no type")
	}
	return e, nil
}

// Replies to a permission request (PermissionReply.Reply).
const (
	ReplyOnce   = "once"   // allow this call
	ReplyAlways = "always" // allow this call and, in this session, every later call of the tool
	ReplyReject = "reject" // decline; with a message, the message goes back to the model
)

// PermissionReply is the value of a message on the permission-replies
// topic (key = session ID, when known).
type PermissionReply struct {
	RequestID string `json:"request_id"`
	Reply     string `json:"reply"`
	Message   string `json:"message,omitempty"`
}

// replyFields are the members of a permission reply, spelled exactly.
var replyFields = map[string]bool{"request_id": true, "reply": true, "message": true}

// DecodeReply parses and validates a permission reply with the discipline
// of Decode: the same size, UTF-8 and depth limits, member names matched
// exactly and never repeated ({"reply":"reject","Reply":"once"} is not an
// approval to anyone), no U+0000 (Postgres text cannot hold it: the reply
// would fail its admission on every retry). Every error is a *RejectError.
func DecodeReply(value []byte, limits Limits) (PermissionReply, error) {
	limits = limits.withDefaults()
	fields, err := decodeObject(value, replyFields, limits)
	if err != nil {
		return PermissionReply{}, err
	}
	var r PermissionReply
	for _, f := range []struct {
		name     string
		dst      *string
		required bool
	}{{"request_id", &r.RequestID, true}, {"reply", &r.Reply, true}, {"message", &r.Message, false}} {
		raw, ok := fields[f.name]
		if !ok {
			if f.required {
				return PermissionReply{}, reject(ReasonMissingField, "%s is required", f.name)
			}
			continue
		}
		if err := decodeString(f.name, raw, f.dst); err != nil {
			return PermissionReply{}, err
		}
	}
	if err := validID("request_id", r.RequestID, 4*limits.MaxIDLength); err != nil {
		return PermissionReply{}, err
	}
	switch r.Reply {
	case ReplyOnce, ReplyAlways, ReplyReject:
	default:
		return PermissionReply{}, reject(ReasonInvalidField, "reply %q: want once, always or reject", truncate([]byte(r.Reply), 64))
	}
	switch {
	case r.Message != "" && r.Reply != ReplyReject:
		return PermissionReply{}, reject(ReasonInvalidField, "message goes only with reply reject")
	case len(r.Message) > limits.MaxTextBytes:
		return PermissionReply{}, reject(ReasonTooLarge, "message is %d bytes, limit %d", len(r.Message), limits.MaxTextBytes)
	case strings.IndexByte(r.Message, 0) >= 0:
		return PermissionReply{}, reject(ReasonInvalidField, "message must not contain U+0000")
	}
	return r, nil
}
