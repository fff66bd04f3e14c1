package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/transcript"
)

// Evidence is what a decision rested on, stored with it.
type Evidence struct {
	Phase              string `json:"phase"`
	AssistantMessageID string `json:"assistant_message_id,omitempty"`
	AssistantStatus    string `json:"assistant_status,omitempty"`
	NewestAssistantID  string `json:"newest_assistant_message_id,omitempty"`
	// SupersededBy is the newest assistant message written after the
	// claim's, other than the errored rest of its own turn (a continuation
	// of the turn that failed before its step began, or the message of
	// an earlier failure recovery created): a newer turn, or the turn
	// gone on past the step. "" when none: nothing supersedes the claim.
	SupersededBy   string          `json:"superseded_by,omitempty"`
	TurnID         string          `json:"turn_id,omitempty"`
	TurnMessageIDs []string        `json:"turn_message_ids,omitempty"`
	Attempts       []AttemptFact   `json:"attempts"`
	ToolCalls      []ToolCallFact  `json:"tool_calls"`
	WaitingInputs  int             `json:"waiting_inputs"`
	Owner          string          `json:"owner"`
	ExpiredAt      time.Time       `json:"expired_at"`
	Extra          json.RawMessage `json:"extra,omitempty"`
	// ContinuationHolders are the inputs that hold the candidate IDs of
	// the execution's continuation (Decide picks one); not stored.
	ContinuationHolders []InputFact `json:"-"`
	// Cap is the session's count against Config.MaxPerSession; nil when
	// no cap is set.
	Cap *CapFact `json:"recovery_cap,omitempty"`

	// ExpiredAtNotFinite is the claim's expires_at when it is not a time
	// ('-infinity', 'infinity': ledger.Claim.ExpiresNotFinite); ExpiredAt
	// is then zero. Such a claim is quarantined (validate).
	ExpiredAtNotFinite string `json:"expired_at_not_finite,omitempty"`

	// TranscriptUnreadable names the first part of the session's
	// transcript that cannot be read back, and why
	// (transcript.CheckHistory); "" when it can be. No turn of the session
	// can be sent until it is repaired: the claim is quarantined
	// (validate).
	TranscriptUnreadable string `json:"transcript_unreadable,omitempty"`
}

// ReasonRecoveryCap begins the quarantine reason of a claim whose session
// reached Config.MaxPerSession.
const ReasonRecoveryCap = "recovery_cap"

// CapFact is how often a session's turns were run again by recovery.
type CapFact struct {
	// Max and Window are the cap (Config.MaxPerSession in
	// Config.MaxPerSessionWindow).
	Max    int    `json:"max"`
	Window string `json:"window"`
	// Recovered counts the session's recoveries that ran its turn again
	// (continued, rewoken) within the window, after the last release of a
	// claim of the session quarantined by the cap (ReleasedAt).
	Recovered  int        `json:"recovered"`
	ReleasedAt *time.Time `json:"released_at,omitempty"`
}

// expiredAtText is when the claim's lease expired, in words: its time, or
// the value expires_at held instead.
func (ev Evidence) expiredAtText() string {
	if ev.ExpiredAtNotFinite != "" {
		return ev.ExpiredAtNotFinite
	}
	return ev.ExpiredAt.UTC().Format(time.RFC3339)
}

// reached says that one more recovery that runs the turn again exceeds
// the cap.
func (c *CapFact) reached() bool { return c != nil && c.Max > 0 && c.Recovered >= c.Max }

// gather reads the evidence of a decision, with the session's count
// against the cap when one is set.
func (r *Recoverer) gather(ctx context.Context, tx pgx.Tx, c ledger.Claim) (Evidence, error) {
	ev, err := gather(ctx, tx, c)
	if err != nil || r.cfg.MaxPerSession <= 0 {
		return ev, err
	}
	ev.Cap = &CapFact{Max: r.cfg.MaxPerSession, Window: r.cfg.MaxPerSessionWindow.String()}
	// A release of a capped claim starts the count afresh: the operator
	// has looked, and the session runs again (up to the cap) before it is
	// capped again.
	//
	// The count is of times: one that is not a time (a hand edit: the
	// columns admit '-infinity' and 'infinity') says nothing about when,
	// so it is left out, a release, a decision or a step's answer alike
	// (invariant 10): a release at 'infinity' fails no decision (the
	// driver reads no infinity into a time), a decision at 'infinity'
	// does not count for good (each release of the capped claim capped
	// again at once), and an answer at 'infinity' does not turn the cap
	// off for the session.
	err = tx.QueryRow(ctx, `SELECT (SELECT max(released_at) FILTER (WHERE isfinite(released_at)) FROM quarantine_releases
		WHERE kind = $2 AND ref = $1 AND starts_with(reason, $3))`, c.SessionID, KindClaim, ReasonRecoveryCap+":").Scan(&ev.Cap.ReleasedAt)
	if err != nil {
		return ev, fmt.Errorf("reading the last release of a capped claim: %w", err)
	}
	// Only recoveries since the session last made progress count: a step
	// answered, or a turn ended, after a recovery proves it was not a loop
	// (a turn that crashes its process each time it runs answers nothing).
	// Counted without it, five lease expiries of a healthy session within
	// the window (a database stall, a paused process, a fleet-wide crash)
	// would quarantine it, a transient fault quarantining a valid row
	// (docs/design.md, invariant 13).
	err = tx.QueryRow(ctx, `SELECT count(*) FROM recoveries
		WHERE session_id = $1 AND decision = ANY($2) AND decided_at > now() - $3 * interval '1 millisecond'
		  AND decided_at < 'infinity'
		  AND ($4::timestamptz IS NULL OR decided_at > $4)
		  AND decided_at > coalesce((SELECT max(completed_at) FILTER (WHERE isfinite(completed_at)) FROM messages
		      WHERE session_id = $1 AND role = 'assistant' AND status IN ('completed', 'errored')), '-infinity')`,
		c.SessionID, []string{string(DecisionContinued), string(DecisionRewoken)}, r.cfg.MaxPerSessionWindow.Milliseconds(), ev.Cap.ReleasedAt).Scan(&ev.Cap.Recovered)
	if err != nil {
		return ev, fmt.Errorf("counting the session's recoveries: %w", err)
	}
	return ev, nil
}

// InputFact is an input holding a continuation's candidate ID.
type InputFact struct {
	MessageID   string
	SessionID   string
	Kind        string
	PayloadHash []byte
}

// AttemptFact is a provider attempt as recovery found it.
type AttemptFact struct {
	ID       string              `json:"id"`
	Step     int                 `json:"step"`
	Provider string              `json:"provider"`
	State    ledger.AttemptState `json:"state"`
	// What was known of the attempt, as early as it was known: the model,
	// the estimated input tokens of its request, and the provider's
	// response or request ID (empty when none arrived before the crash).
	Model         string `json:"model,omitempty"`
	RequestTokens int64  `json:"request_tokens,omitempty"`
	ResponseID    string `json:"response_id,omitempty"`
}

// ToolCallFact is a tool call as recovery found it.
type ToolCallFact struct {
	ID        string           `json:"id"`
	AttemptID string           `json:"attempt_id"`
	Tool      string           `json:"tool"`
	Class     string           `json:"class"`
	State     ledger.CallState `json:"state"`
}

func gather(ctx context.Context, tx pgx.Tx, c ledger.Claim) (Evidence, error) {
	ev := Evidence{Phase: string(c.Phase), AssistantMessageID: c.AssistantMessageID, Owner: c.OwnerID, ExpiredAt: c.ExpiresAt,
		ExpiredAtNotFinite: c.ExpiresNotFinite, Attempts: []AttemptFact{}, ToolCalls: []ToolCallFact{}}
	if c.AssistantMessageID != "" {
		var turnID *string
		err := tx.QueryRow(ctx, `SELECT status, coalesce(answers, '{}'), turn_id FROM messages WHERE message_id = $1 AND session_id = $2 AND role = 'assistant'`,
			c.AssistantMessageID, c.SessionID).Scan(&ev.AssistantStatus, &ev.TurnMessageIDs, &turnID)
		if err != nil && !errors.Is(interpretError(err), errNotFound) {
			return ev, fmt.Errorf("reading assistant message: %w", err)
		}
		if turnID != nil {
			ev.TurnID = *turnID
		}
	}
	err := tx.QueryRow(ctx, `SELECT coalesce((SELECT message_id FROM messages WHERE session_id = $1 AND role = 'assistant' ORDER BY seq DESC LIMIT 1), '')`,
		c.SessionID).Scan(&ev.NewestAssistantID)
	if err != nil {
		return ev, fmt.Errorf("reading newest assistant message: %w", err)
	}
	if c.AssistantMessageID != "" && ev.NewestAssistantID != c.AssistantMessageID {
		// The same rule as an operator's resolution (refuseSuperseded).
		n, found, err := transcript.ReadNewerStep(ctx, tx, &transcript.NewerStepParams{MessageID: c.AssistantMessageID})
		if err != nil {
			return ev, fmt.Errorf("reading newer assistant messages: %w", err)
		}
		if found {
			ev.SupersededBy = n.MessageID
		}
	}
	// Every decision that runs the session again reads its transcript:
	// one that cannot be read would fail it at every lease.
	var unreadable *transcript.UnreadablePartError
	switch err := transcript.CheckHistory(ctx, tx, &transcript.CheckHistoryParams{SessionID: c.SessionID}); {
	case errors.As(err, &unreadable):
		ev.TranscriptUnreadable = unreadable.Error()
	case err != nil:
		return ev, fmt.Errorf("reading the transcript's tool calls: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT attempt_id, step, provider, state, coalesce(model, ''), coalesce(request_tokens, 0), coalesce(response_id, '')
		FROM attempts WHERE execution_id = $1 ORDER BY step`, c.ExecutionID)
	if err != nil {
		return ev, fmt.Errorf("reading attempts: %w", err)
	}
	if ev.Attempts, err = pgx.AppendRows(ev.Attempts, rows, pgx.RowToStructByPos[AttemptFact]); err != nil {
		return ev, fmt.Errorf("reading attempts: %w", err)
	}
	// Calls of the execution, and calls it took over from an earlier one
	// (a continuation runs the requested calls of the execution it continues).
	rows, err = tx.Query(ctx, `SELECT call_id, attempt_id, tool, class, state FROM tool_calls
		WHERE session_id = $1 AND state IN ('requested', 'started') ORDER BY requested_at, call_id`, c.SessionID)
	if err != nil {
		return ev, fmt.Errorf("reading tool calls: %w", err)
	}
	if ev.ToolCalls, err = pgx.AppendRows(ev.ToolCalls, rows, pgx.RowToStructByPos[ToolCallFact]); err != nil {
		return ev, fmt.Errorf("reading tool calls: %w", err)
	}
	err = tx.QueryRow(ctx, `SELECT count(*) FROM waiting_inputs WHERE session_id = $1`,
		c.SessionID).Scan(&ev.WaitingInputs)
	if err != nil {
		return ev, fmt.Errorf("counting waiting inputs: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT message_id, session_id, kind, payload_hash FROM inputs WHERE message_id = ANY($1) ORDER BY message_id`,
		[]string{ContinuationID(c.ExecutionID), ContinuationTakenID(c.ExecutionID)})
	if err != nil {
		return ev, fmt.Errorf("reading continuation inputs: %w", err)
	}
	if ev.ContinuationHolders, err = pgx.AppendRows(ev.ContinuationHolders, rows, pgx.RowToStructByPos[InputFact]); err != nil {
		return ev, fmt.Errorf("reading continuation inputs: %w", err)
	}
	return ev, nil
}
