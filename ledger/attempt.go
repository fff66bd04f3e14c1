package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// AttemptState is a provider attempt's state, stored as text in
// attempts.state.
type AttemptState string

// Attempt states.
const (
	AttemptStarted   AttemptState = "started"    // intent committed; the request may be in flight
	AttemptRetryWait AttemptState = "retry_wait" // retry at next_retry_at: certainly not acted on, or (a provider that honours keys) with the same key
	AttemptSucceeded AttemptState = "succeeded"
	AttemptFailed    AttemptState = "failed"
	AttemptUnknown   AttemptState = "unknown" // outcome not known; never replayed automatically
)

// CallState is a tool call's state, stored as text in tool_calls.state.
type CallState string

// Tool call states.
const (
	CallRequested   CallState = "requested" // the model asked; not dispatched
	CallStarted     CallState = "started"   // intent committed; the tool may be running
	CallSucceeded   CallState = "succeeded"
	CallFailed      CallState = "failed"
	CallUnknown     CallState = "unknown"     // outcome not known; a side-effecting call is never re-run
	CallInterrupted CallState = "interrupted" // never dispatched, and never will be
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
	// Model is the model the provider is asked for ("" when it names
	// none), recorded with the intent.
	Model string
	// RequestTokens estimates the request's input tokens, recorded with
	// the intent (the pipeline's estimate: its request's JSON bytes / 4).
	RequestTokens int64
}

// BeginAttempt commits the intent of a provider attempt, with the claim's
// phase set to unknown, inside a Write transaction: from here until
// FinishAttempt, a crash leaves evidence that the request may have been
// sent. A retry of the same attempt (after DeferAttempt) counts a try.
func (x *Execution) BeginAttempt(ctx context.Context, tx pgx.Tx, p AttemptParams) error {
	tag, err := tx.Exec(ctx, beginAttemptSQL, p.ID, x.claim.SessionID, x.claim.ExecutionID, p.AssistantMessageID,
		p.Step, p.Provider, p.IdempotencyKey, x.claim.Token, p.RequestHash, p.Model, p.RequestTokens)
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
	err = tx.QueryRow(ctx, attemptRetrySQL, id).Scan(&tries, &ms)
	return tries, time.Duration(ms) * time.Millisecond, err
}

// attemptRetrySQL reads the wait until next_retry_at. A next_retry_at
// that is not a time ('-infinity' or 'infinity': the column admits both,
// and a hand edit, a restore or a repair script may leave one) says
// nothing of when the retry is due, and the clock cannot be subtracted
// from it (a data error, which would fail the executor's deferral and
// leave a turn whose request was certainly not acted on to recovery): it
// is due now, as a waiting input admitted at 'infinity' is a lost wake
// due now.
const attemptRetrySQL = `
SELECT tries, CASE WHEN isfinite(next_retry_at)
                   THEN greatest(0, extract(epoch FROM next_retry_at - now()) * 1000) ELSE 0 END
FROM attempts WHERE attempt_id = $1`

// FinishAttempt records the attempt's outcome (succeeded, failed or
// unknown) with usage and error text.
func FinishAttempt(ctx context.Context, tx pgx.Tx, id string, state AttemptState, errText string, inputTokens, outputTokens int64) error {
	return FinishAttemptWith(ctx, tx, id, state, errText, inputTokens, outputTokens, "")
}

// FinishAttemptWith is FinishAttempt that also records the provider's
// response ID, unless it is empty or one is recorded already (the
// best-effort RecordResponseID of the first bytes).
func FinishAttemptWith(ctx context.Context, tx pgx.Tx, id string, state AttemptState, errText string, inputTokens, outputTokens int64, responseID string) error {
	_, err := tx.Exec(ctx, finishAttemptSQL, id, string(state), errText, inputTokens, outputTokens, responseID)
	if err != nil {
		return fmt.Errorf("recording outcome of attempt %s: %w", id, err)
	}
	return nil
}

// RecordResponseID records the provider's response or request ID of an
// attempt still in flight (state started), behind the fence, in a Write
// transaction of its own: what an operator needs to ask the provider about
// an attempt that ends unknown. The pipeline calls it as soon as the first
// bytes of the answer arrive, best effort. It records nothing once the
// attempt has an outcome (the outcome's own statement records the ID) or
// an ID; recorded reports whether it wrote.
func (x *Execution) RecordResponseID(ctx context.Context, attemptID, responseID string) (recorded bool, err error) {
	err = x.Write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, recordResponseIDSQL, attemptID, x.claim.Token, responseID)
		if err != nil {
			return fmt.Errorf("recording response ID of attempt %s: %w", attemptID, err)
		}
		recorded = tag.RowsAffected() == 1
		return nil
	})
	return recorded, err
}

// ReadAttemptState reads an attempt's state ("" when there is no such
// attempt): what a retried write checks to know whether it committed.
func ReadAttemptState(ctx context.Context, tx pgx.Tx, id string) (AttemptState, error) {
	var state AttemptState
	err := tx.QueryRow(ctx, `SELECT state FROM attempts WHERE attempt_id = $1`, id).Scan(&state)
	if errors.Is(interpretError(err), errNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading attempt %s: %w", id, err)
	}
	return state, nil
}

// ReadCallState reads a tool call's state ("" when there is no such call).
func ReadCallState(ctx context.Context, tx pgx.Tx, callID string) (CallState, error) {
	var state CallState
	err := tx.QueryRow(ctx, `SELECT state FROM tool_calls WHERE call_id = $1`, callID).Scan(&state)
	if errors.Is(interpretError(err), errNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading tool call %s: %w", callID, err)
	}
	return state, nil
}

// CallSettled reports whether a call has its result (a retried settle that
// committed), and whether no call of its attempt is still open, as the
// settle's answer says (promptline_call_settle).
func CallSettled(ctx context.Context, tx pgx.Tx, callID, attemptID string) (settled, last bool, err error) {
	state, err := ReadCallState(ctx, tx, callID)
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

// CallInput is a call's input as it is stored: the model's JSON, or what
// the model sent as a JSON string when it is not JSON (evidence, not
// input).
func CallInput(input json.RawMessage) json.RawMessage {
	if json.Valid(input) {
		return input
	}
	s, _ := json.Marshal(string(input))
	return s
}

// beginAttemptSQL is insertAttemptSQL that may also begin a deferred
// attempt again.
const beginAttemptSQL = insertAttemptSQL + `
ON CONFLICT (attempt_id) DO UPDATE SET state = 'started', tries = attempts.tries + 1,
    next_retry_at = NULL, fencing_token = excluded.fencing_token, started_at = now(),
    model = excluded.model, request_tokens = excluded.request_tokens, response_id = NULL, response_id_at = NULL
WHERE attempts.state = 'retry_wait'`

// recordResponseIDSQL names the attempt's fencing token too: an attempt
// begun again by a later execution (a retry under the same ID) is not
// this one's to annotate.
const recordResponseIDSQL = `
UPDATE attempts SET response_id = $3, response_id_at = now()
WHERE attempt_id = $1 AND fencing_token = $2 AND state = 'started' AND response_id IS NULL`

const deferAttemptSQL = `
UPDATE attempts SET state = 'retry_wait', next_retry_at = now() + $2 * interval '1 millisecond', error = $3
WHERE attempt_id = $1 AND state = 'started'`

const finishAttemptSQL = `
UPDATE attempts SET state = $2, error = nullif($3, ''), input_tokens = $4, output_tokens = $5, finished_at = now(),
    response_id = coalesce(response_id, nullif($6, '')),
    response_id_at = CASE WHEN response_id IS NULL AND $6 <> '' THEN now() ELSE response_id_at END
WHERE attempt_id = $1`

const openCallsSQL = `SELECT count(*) FROM tool_calls WHERE attempt_id = $1 AND state IN ('requested', 'started')`

// AtRisk is the spend at risk of one provider and model: the attempts whose
// outcome is unknown (they may have been billed) and the sum of their
// requests' estimated input tokens.
type AtRisk struct {
	Provider string
	Model    string
	Attempts int64
	Tokens   int64
}

// AttemptsAtRisk reads the attempts left unknown, by provider and model
// ("" when none was recorded): those that no operator resolved (`consumer
// session resolve`, either finding) and not yet pruned
// (--ledger-retention). It reads the partial index attempts_unknown, not
// the ledger.
func AttemptsAtRisk(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]AtRisk, error) {
	rows, err := q.Query(ctx, attemptsAtRiskSQL)
	if err != nil {
		return nil, fmt.Errorf("reading attempts at risk: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AtRisk])
	if err != nil {
		return nil, fmt.Errorf("reading attempts at risk: %w", err)
	}
	return all, nil
}

// attemptsAtRiskSQL: an attempt an operator resolved (either finding:
// it was not sent, and is failed, or it ran, and is spent, not at risk)
// has a resolution.
const attemptsAtRiskSQL = `
SELECT a.provider, coalesce(a.model, ''), count(*), coalesce(sum(a.request_tokens), 0)::bigint
FROM attempts a
WHERE a.state = 'unknown'
  AND NOT EXISTS (SELECT 1 FROM resolutions r WHERE r.target_id = a.attempt_id AND r.target_kind = 'attempt')
GROUP BY 1, 2 ORDER BY 1, 2`
