package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/promptline/promptline/transcript"
)

// The ledger's side of an operator's resolution (consumer session
// resolve): reading a tool call or provider attempt left unknown, and
// replacing its unknown outcome by what the operator found. The caller
// (recovery.Resolve) holds the session's row lock, has checked that no
// claim holds the session (ReadSessionClaim: so no execution writes these
// rows meanwhile) and audits the finding in the same transaction. This is the one way an
// unknown outcome changes (invariant 12): never automatically, once per
// finding, audited.

// Kinds of resolution target.
const (
	TargetToolCall = "tool_call"
	TargetAttempt  = "attempt"
)

// Target is an unknown tool call or provider attempt as a resolution
// reads it.
type Target struct {
	Kind               string
	ID                 string
	SessionID          string
	ExecutionID        string
	AttemptID          string // the call's attempt (Kind tool_call), or ID
	AssistantMessageID string // the assistant message of the call's or attempt's step
	State              string
	Tool               string // tool calls only
	Class              string // tool calls only
	ModelCallID        string // tool calls only
	Output             string // tool calls: the result recorded so far; attempts: the error text
	Token              int64
}

// ErrNoTarget says that no tool call or provider attempt has that ID.
var ErrNoTarget = errors.New("no tool call or provider attempt with that ID")

// ReadTarget reads the tool call or, when none has that ID, the provider
// attempt id, and locks its row.
func ReadTarget(ctx context.Context, tx pgx.Tx, id string) (Target, error) {
	t := Target{Kind: TargetToolCall, ID: id}
	err := tx.QueryRow(ctx, readCallTargetSQL, id).Scan(&t.SessionID, &t.ExecutionID, &t.AttemptID, &t.AssistantMessageID,
		&t.State, &t.Tool, &t.Class, &t.ModelCallID, &t.Output, &t.Token)
	if err == nil {
		return t, nil
	}
	if !errors.Is(interpretError(err), errNotFound) {
		return t, fmt.Errorf("reading tool call %s: %w", id, err)
	}
	t = Target{Kind: TargetAttempt, ID: id, AttemptID: id}
	err = tx.QueryRow(ctx, readAttemptTargetSQL, id).Scan(&t.SessionID, &t.ExecutionID, &t.AssistantMessageID, &t.State, &t.Output, &t.Token)
	if errors.Is(interpretError(err), errNotFound) {
		return t, fmt.Errorf("%s: %w", id, ErrNoTarget)
	}
	if err != nil {
		return t, fmt.Errorf("reading provider attempt %s: %w", id, err)
	}
	return t, nil
}

// SessionClaimParams names the session whose claim a resolution checks.
type SessionClaimParams struct {
	SessionID string
}

// SessionClaim is the claim that holds a session, as a resolution reads
// it to say why it refuses.
type SessionClaim struct {
	ExecutionID string
	OwnerID     string
	Phase       Phase
	ExpiresAt   time.Time
	// ExpiresNotFinite is as Claim's: the value of expires_at when it is
	// not a time (ExpiresAt is then zero).
	ExpiresNotFinite string
	Quarantined      bool
}

// ReadSessionClaim reads the claim that holds the session (live, expired
// or quarantined); found is false when none does, and the session's one
// writer is then the caller, under the session's row lock.
func ReadSessionClaim(ctx context.Context, tx pgx.Tx, p *SessionClaimParams) (c SessionClaim, found bool, err error) {
	var phase string
	var expires pgtype.Timestamptz
	err = tx.QueryRow(ctx, sessionClaimSQL, p.SessionID).Scan(&c.ExecutionID, &c.OwnerID, &phase, &expires, &c.Quarantined)
	if errors.Is(interpretError(err), errNotFound) {
		return SessionClaim{}, false, nil
	}
	if err != nil {
		return SessionClaim{}, false, fmt.Errorf("reading the claim of %s: %w", p.SessionID, err)
	}
	c.Phase = Phase(phase)
	c.ExpiresAt, c.ExpiresNotFinite = expiryOf(expires)
	return c, true, nil
}

// ResolveCallNotRun re-arms an unknown tool call that the operator found
// did not run: it is requested again, so that the continuation runs it
// (once: its intent is committed before it runs, as any call's), under its
// own idempotency key. The unknown result's tool message goes, as the call
// will have its real one.
func ResolveCallNotRun(ctx context.Context, tx pgx.Tx, callID string) error {
	tag, err := tx.Exec(ctx, rearmCallSQL, callID)
	if err != nil {
		return fmt.Errorf("re-arming tool call %s: %w", callID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("re-arming tool call %s: it is no longer unknown", callID)
	}
	if err := transcript.DeleteParts(ctx, tx, &transcript.DeletePartsParams{MessageID: callID}); err != nil {
		return fmt.Errorf("removing the unknown result of %s: %w", callID, err)
	}
	if err := transcript.DeleteToolMessage(ctx, tx, &transcript.DeleteToolMessageParams{MessageID: callID}); err != nil {
		return fmt.Errorf("removing the unknown result of %s: %w", callID, err)
	}
	return nil
}

// ResolveCallRan settles an unknown tool call that the operator found ran,
// with the output the operator gives: the call succeeded with it, and its
// tool message (the result the model sees) says it.
func ResolveCallRan(ctx context.Context, tx pgx.Tx, t Target, output string) error {
	tag, err := tx.Exec(ctx, settleResolvedCallSQL, t.ID, output)
	if err != nil {
		return fmt.Errorf("settling tool call %s: %w", t.ID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("settling tool call %s: it is no longer unknown", t.ID)
	}
	if err := transcript.DeleteParts(ctx, tx, &transcript.DeletePartsParams{MessageID: t.ID}); err != nil {
		return fmt.Errorf("replacing the result of %s: %w", t.ID, err)
	}
	if err := transcript.UpsertResolvedToolMessage(ctx, tx, &transcript.ResolvedToolMessageParams{
		ID: t.ID, SessionID: t.SessionID, ToolCallID: t.ModelCallID, ExecutionID: t.ExecutionID, Token: t.Token,
	}); err != nil {
		return fmt.Errorf("storing the result of %s: %w", t.ID, err)
	}
	if err := transcript.InsertTextPart(ctx, tx, &transcript.TextPartParams{MessageID: t.ID, Body: output}); err != nil {
		return fmt.Errorf("storing the result of %s: %w", t.ID, err)
	}
	return nil
}

// ResolveAttemptNotSent settles an unknown provider attempt that the
// operator found was never acted on: it failed, not sent; the
// continuation sends its step again as a new attempt.
func ResolveAttemptNotSent(ctx context.Context, tx pgx.Tx, attemptID, errText string) error {
	tag, err := tx.Exec(ctx, `UPDATE attempts SET state = 'failed', error = $2, finished_at = now()
		WHERE attempt_id = $1 AND state = 'unknown'`, attemptID, errText)
	if err != nil {
		return fmt.Errorf("settling attempt %s: %w", attemptID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("settling attempt %s: it is no longer unknown", attemptID)
	}
	return nil
}

// LaterUnknown returns the kind and ID of a provider attempt or tool call
// of t's turn, after t, whose outcome is unknown ("" when none): another
// attempt of t's step or of a later step, or a tool call of a later step.
// A continuation of t's turn would send that step to the provider again,
// or continue past that call, though no one vouched for it (P4). The tool
// calls of t's own step are not after t: the continuation hands the model
// their unknown results, as always.
func LaterUnknown(ctx context.Context, tx pgx.Tx, t Target) (kind, id string, err error) {
	err = tx.QueryRow(ctx, laterUnknownSQL, t.AssistantMessageID, t.SessionID, t.AttemptID).Scan(&kind, &id)
	if errors.Is(interpretError(err), errNotFound) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("reading unknown outcomes after %s: %w", t.ID, err)
	}
	return kind, id, nil
}

const sessionClaimSQL = `SELECT execution_id, owner_id, phase, expires_at, quarantine_reason IS NOT NULL FROM claims WHERE session_id = $1`

// laterUnknownSQL names a message's turn as transcript does:
// coalesce(turn_id, message_id), a message written before migration 00003
// being a turn of its own.
const laterUnknownSQL = `
SELECT kind, id FROM (
  SELECT 'attempt' AS kind, a.attempt_id AS id, n.seq
  FROM attempts a JOIN messages n ON n.message_id = a.assistant_message_id, messages m
  WHERE m.message_id = $1 AND a.session_id = $2 AND a.state = 'unknown' AND a.attempt_id <> $3
    AND coalesce(n.turn_id, n.message_id) = coalesce(m.turn_id, m.message_id) AND (n.seq > m.seq OR n.message_id = m.message_id)
  UNION ALL
  SELECT 'tool_call', c.call_id, n.seq
  FROM tool_calls c JOIN attempts a ON a.attempt_id = c.attempt_id JOIN messages n ON n.message_id = a.assistant_message_id, messages m
  WHERE m.message_id = $1 AND c.session_id = $2 AND c.state = 'unknown'
    AND coalesce(n.turn_id, n.message_id) = coalesce(m.turn_id, m.message_id) AND n.seq > m.seq
) later ORDER BY seq, kind, id LIMIT 1`

const readCallTargetSQL = `
SELECT t.session_id, t.execution_id, t.attempt_id, a.assistant_message_id, t.state, t.tool, t.class, t.model_call_id,
       coalesce(t.output, ''), t.fencing_token
FROM tool_calls t JOIN attempts a ON a.attempt_id = t.attempt_id
WHERE t.call_id = $1 FOR UPDATE OF t`

const readAttemptTargetSQL = `
SELECT session_id, execution_id, assistant_message_id, state, coalesce(error, ''), fencing_token
FROM attempts WHERE attempt_id = $1 FOR UPDATE`

const rearmCallSQL = `
UPDATE tool_calls SET state = 'requested', output = NULL, is_error = NULL, started_at = NULL, finished_at = NULL
WHERE call_id = $1 AND state = 'unknown'`

const settleResolvedCallSQL = `
UPDATE tool_calls SET state = 'succeeded', output = $2, is_error = false, finished_at = now()
WHERE call_id = $1 AND state = 'unknown'`
