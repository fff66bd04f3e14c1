package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attempt states.
const (
	AttemptStarted   = "started"    // intent committed; the request may be in flight
	AttemptRetryWait = "retry_wait" // retry at next_retry_at: certainly not acted on, or (a provider that honours keys) with the same key
	AttemptSucceeded = "succeeded"
	AttemptFailed    = "failed"
	AttemptUnknown   = "unknown" // outcome not known; never replayed automatically
)

// Tool call states.
const (
	CallRequested   = "requested" // the model asked; not dispatched
	CallStarted     = "started"   // intent committed; the tool may be running
	CallSucceeded   = "succeeded"
	CallFailed      = "failed"
	CallUnknown     = "unknown"     // outcome not known; a side-effecting call is never re-run
	CallInterrupted = "interrupted" // never dispatched, and never will be
)

// ContinuationPrefix starts the message ID of every continuation input
// that recovery admits: recovery-continue-<execution ID>.
const ContinuationPrefix = "recovery-continue-"

// ContinuationID is the deterministic continuation input of an execution.
func ContinuationID(executionID string) string { return ContinuationPrefix + executionID }

// AttemptID is the deterministic ID of a provider step of an execution: a
// retry of the step reuses it, and with it the idempotency key.
func AttemptID(executionID string, step int) string {
	return fmt.Sprintf("%s/step-%d", executionID, step)
}

// AttemptParams is the intent of a provider attempt.
type AttemptParams struct {
	ID                 string
	AssistantMessageID string
	Step               int
	Provider           string
	IdempotencyKey     string
	RequestHash        []byte
}

// BeginAttempt commits the intent of a provider attempt, with the claim's
// phase set to unknown, inside a Write transaction: from here until
// FinishAttempt, a crash leaves evidence that the request may have been
// sent. A retry of the same attempt (after DeferAttempt) counts a try.
func (x *Execution) BeginAttempt(ctx context.Context, tx pgx.Tx, p AttemptParams) error {
	tag, err := tx.Exec(ctx, beginAttemptSQL, p.ID, x.claim.SessionID, x.claim.ExecutionID, p.AssistantMessageID,
		p.Step, p.Provider, p.IdempotencyKey, x.claim.Token, p.RequestHash)
	if err != nil {
		return fmt.Errorf("recording attempt %s: %w", p.ID, err)
	}
	if tag.RowsAffected() != 1 {
		// Only a deferred attempt may be begun again; anything else is a
		// reuse of an attempt ID, which would mix two requests' evidence.
		return fmt.Errorf("recording attempt %s: it exists and is not awaiting a retry", p.ID)
	}
	return x.SetPhase(ctx, tx, PhaseUnknown, p.AssistantMessageID)
}

// DeferAttempt records that the attempt certainly was not acted on and
// schedules its retry. The phase becomes continue: nothing is uncertain,
// and the step needs another provider attempt — after a crash, recovery
// continues the turn (phase ready would re-wake the session, whose inputs
// are already promoted into this turn, and the turn would never finish).
func (x *Execution) DeferAttempt(ctx context.Context, tx pgx.Tx, id string, retryAfter time.Duration, cause string) error {
	_, err := tx.Exec(ctx, deferAttemptSQL, id, retryAfter.Milliseconds(), cause)
	if err != nil {
		return fmt.Errorf("deferring attempt %s: %w", id, err)
	}
	return x.SetPhase(ctx, tx, PhaseContinue, "")
}

// AttemptRetry reads a deferred attempt's tries and the time to wait.
func AttemptRetry(ctx context.Context, tx pgx.Tx, id string) (tries int, wait time.Duration, err error) {
	var ms float64
	err = tx.QueryRow(ctx, `SELECT tries, greatest(0, extract(epoch FROM next_retry_at - now()) * 1000) FROM attempts WHERE attempt_id = $1`, id).Scan(&tries, &ms)
	return tries, time.Duration(ms) * time.Millisecond, err
}

// FinishAttempt records the attempt's outcome (succeeded, failed or
// unknown) with usage and error text.
func FinishAttempt(ctx context.Context, tx pgx.Tx, id, state, errText string, inputTokens, outputTokens int64) error {
	_, err := tx.Exec(ctx, finishAttemptSQL, id, state, errText, inputTokens, outputTokens)
	if err != nil {
		return fmt.Errorf("recording outcome of attempt %s: %w", id, err)
	}
	return nil
}

// AttemptState reads an attempt's state ("" when there is no such
// attempt): what a retried write checks to know whether it committed.
func AttemptState(ctx context.Context, tx pgx.Tx, id string) (string, error) {
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM attempts WHERE attempt_id = $1`, id).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading attempt %s: %w", id, err)
	}
	return state, nil
}

// CallState reads a tool call's state ("" when there is no such call).
func CallState(ctx context.Context, tx pgx.Tx, callID string) (string, error) {
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM tool_calls WHERE call_id = $1`, callID).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading tool call %s: %w", callID, err)
	}
	return state, nil
}

// CallSettled reports whether a call has its result (a retried
// SettleCall that committed), and whether no call of its attempt is still
// open, as SettleCall's last.
func CallSettled(ctx context.Context, tx pgx.Tx, callID, attemptID string) (settled, last bool, err error) {
	state, err := CallState(ctx, tx, callID)
	if err != nil || state == "" || state == CallRequested || state == CallStarted {
		return false, false, err
	}
	var open int
	if err := tx.QueryRow(ctx, openCallsSQL, attemptID).Scan(&open); err != nil {
		return false, false, fmt.Errorf("counting open tool calls: %w", err)
	}
	return true, open == 0, nil
}

// CallParams is a tool call the model requested.
type CallParams struct {
	ID             string
	AttemptID      string
	Index          int
	ModelCallID    string
	Tool           string
	Class          string
	Input          json.RawMessage
	IdempotencyKey string
}

// RequestCalls records the tool calls of a step as requested, in the
// transaction that records the attempt's response.
func (x *Execution) RequestCalls(ctx context.Context, tx pgx.Tx, calls []CallParams) error {
	for _, c := range calls {
		input := c.Input
		if !json.Valid(input) {
			// Keep what the model sent, as a JSON string: evidence, not input.
			input, _ = json.Marshal(string(c.Input))
		}
		if _, err := tx.Exec(ctx, requestCallSQL, c.ID, c.AttemptID, x.claim.SessionID, x.claim.ExecutionID, c.Index,
			c.ModelCallID, c.Tool, c.Class, input, c.IdempotencyKey, x.claim.Token); err != nil {
			return fmt.Errorf("recording tool call %s: %w", c.ID, err)
		}
	}
	return nil
}

// StartCall commits a tool call's intent, and the phase unknown, before the
// tool runs.
func (x *Execution) StartCall(ctx context.Context, tx pgx.Tx, callID string) error {
	tag, err := tx.Exec(ctx, startCallSQL, callID)
	if err != nil {
		return fmt.Errorf("starting tool call %s: %w", callID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("starting tool call %s: not in state requested", callID)
	}
	return x.SetPhase(ctx, tx, PhaseUnknown, "")
}

// SettleCall records a call's result. When it was the step's last unsettled
// call, the same transaction sets the phase to continue (the model must see
// the results), and last is true.
func (x *Execution) SettleCall(ctx context.Context, tx pgx.Tx, callID, attemptID, state, output string, isError bool) (last bool, err error) {
	if _, err := tx.Exec(ctx, settleCallSQL, callID, state, output, isError); err != nil {
		return false, fmt.Errorf("settling tool call %s: %w", callID, err)
	}
	var open int
	if err := tx.QueryRow(ctx, openCallsSQL, attemptID).Scan(&open); err != nil {
		return false, fmt.Errorf("counting open tool calls: %w", err)
	}
	if open > 0 {
		return false, nil
	}
	return true, x.SetPhase(ctx, tx, PhaseContinue, "")
}

// beginAttemptSQL is insertAttemptSQL that may also begin a deferred
// attempt again.
const beginAttemptSQL = insertAttemptSQL + `
ON CONFLICT (attempt_id) DO UPDATE SET state = 'started', tries = attempts.tries + 1,
    next_retry_at = NULL, fencing_token = excluded.fencing_token, started_at = now()
WHERE attempts.state = 'retry_wait'`

const deferAttemptSQL = `
UPDATE attempts SET state = 'retry_wait', next_retry_at = now() + $2 * interval '1 millisecond', error = $3
WHERE attempt_id = $1 AND state = 'started'`

const finishAttemptSQL = `
UPDATE attempts SET state = $2, error = nullif($3, ''), input_tokens = $4, output_tokens = $5, finished_at = now()
WHERE attempt_id = $1`

const requestCallSQL = `
INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
                        input, idempotency_key, fencing_token, state)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'requested')`

const openCallsSQL = `SELECT count(*) FROM tool_calls WHERE attempt_id = $1 AND state IN ('requested', 'started')`

const startCallSQL = `UPDATE tool_calls SET state = 'started', started_at = now() WHERE call_id = $1 AND state = 'requested'`

const settleCallSQL = `
UPDATE tool_calls SET state = $2, output = $3, is_error = $4, finished_at = now()
WHERE call_id = $1 AND state IN ('requested', 'started')`
