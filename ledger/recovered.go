package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/promptline/promptline/internal/pgdb"
)

// The ledger's side of a recovery decision: what recovery (recovery's
// apply, carryOut, reconcile and quarantineTx) writes on claims, attempts
// and tool_calls after it has taken the claim over (Takeover) or, for a
// quarantine, instead of taking it over. Each runs in recovery's
// transaction, under the session's row lock, together with the decision's
// record and outbox rows (invariant 9); none of them decides anything:
// recovery's Decide chose, from the evidence, which of them run.

// Recovery also reads claims outside a decision: the expired claims a
// pass handles (ExpiredClaims, on the pool, or in a plan's snapshot) and
// the number quarantined, for the gauge (CountQuarantinedClaims).

// RearmIdempotentCallsParams names the session whose started idempotent
// tool calls are requested again.
type RearmIdempotentCallsParams struct {
	SessionID string
}

// RearmIdempotentCalls moves the session's started idempotent tool calls
// back to requested (the continuation runs them again, each with its own
// idempotency key, so that a tool that honours keys acts once). Started
// side-effecting calls are left as they are: they are never re-run (P4).
// Recovery calls it when it continues a turn by the idempotent tool retry
// rule.
func RearmIdempotentCalls(ctx context.Context, tx pgx.Tx, p *RearmIdempotentCallsParams) error {
	if _, err := tx.Exec(ctx, rearmIdempotentCallsSQL, p.SessionID); err != nil {
		return fmt.Errorf("re-arming idempotent tool calls: %w", err)
	}
	return nil
}

// SettleRetriedAttemptParams names the deferred attempt whose retry the
// continuation sends.
type SettleRetriedAttemptParams struct {
	AttemptID string
}

// SettleRetriedAttempt settles a deferred attempt (retry_wait: answered
// with a failure, waiting for its retry) as failed, noting in its error
// that the retry is sent again under the same idempotency key. It touches
// the attempt only while it is retry_wait. Recovery calls it when the
// continuation it admits sends that retry.
func SettleRetriedAttempt(ctx context.Context, tx pgx.Tx, p *SettleRetriedAttemptParams) error {
	if _, err := tx.Exec(ctx, settleRetriedAttemptSQL, p.AttemptID); err != nil {
		return fmt.Errorf("settling deferred attempt %s: %w", p.AttemptID, err)
	}
	return nil
}

// SettleDeferredAttemptsParams names the execution whose deferred
// attempts are settled.
type SettleDeferredAttemptsParams struct {
	ExecutionID string
}

// SettleDeferredAttempts settles every attempt of the execution still
// deferred (retry_wait: certainly not sent) as failed, noting that
// recovery continued the turn: the continuation sends the step afresh.
// Recovery calls it for every continued decision.
func SettleDeferredAttempts(ctx context.Context, tx pgx.Tx, p *SettleDeferredAttemptsParams) error {
	if _, err := tx.Exec(ctx, settleDeferredAttemptsSQL, p.ExecutionID); err != nil {
		return fmt.Errorf("settling deferred attempts: %w", err)
	}
	return nil
}

// ReconcileAttemptsParams names the execution whose open attempts are
// reconciled, and the error text they get.
type ReconcileAttemptsParams struct {
	ExecutionID string
	Error       string
}

// ReconcileAttempts marks every attempt of the execution that has no
// outcome (started, or retry_wait) unknown, with p.Error: it is never
// replayed automatically (P4); only an operator's finding settles it.
// Recovery calls it when it reconciles a turn.
func ReconcileAttempts(ctx context.Context, tx pgx.Tx, p *ReconcileAttemptsParams) error {
	if _, err := tx.Exec(ctx, reconcileAttemptsSQL, p.ExecutionID, p.Error); err != nil {
		return fmt.Errorf("reconciling attempts: %w", err)
	}
	return nil
}

// ReconcileCallsParams names the session whose open tool calls are
// reconciled, and the output a started call gets.
type ReconcileCallsParams struct {
	SessionID string
	// Output is the result recorded for a started call (now unknown); a
	// requested one is recorded as never dispatched.
	Output string
}

// ReconcileCalls settles every open tool call of the session, as an
// error: a started call (it may have run) unknown, with p.Output; a
// requested call (never dispatched) interrupted. It returns the calls it
// settled, each with its new state, in the order they were requested
// (request time, attempt, index): the order in which recovery announces
// them (tool.completed). Recovery calls it when it reconciles a turn.
func ReconcileCalls(ctx context.Context, tx pgx.Tx, p *ReconcileCallsParams) ([]SettledCall, error) {
	rows, err := tx.Query(ctx, reconcileCallsSQL, p.SessionID, p.Output)
	if err != nil {
		return nil, fmt.Errorf("reconciling tool calls: %w", err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[SettledCall])
	if err != nil {
		return nil, fmt.Errorf("reconciling tool calls: %w", err)
	}
	return calls, nil
}

// ClearClaimParams names the claim to delete: the session's, while it
// holds Token.
type ClearClaimParams struct {
	SessionID string
	Token     int64
}

// ClearClaim deletes the session's claim if it still holds p.Token (the
// takeover's), so that a claim taken since is left alone. It is the
// statement Execution.Release and Finish run (releaseSQL), without their
// fence and waiting-input check: recovery calls it after every decision on
// a takeover claim, and writes the wake that waiting inputs need itself
// (invariant 7).
func ClearClaim(ctx context.Context, tx pgx.Tx, p *ClearClaimParams) error {
	if _, err := tx.Exec(ctx, releaseSQL, p.SessionID, p.Token); err != nil {
		return fmt.Errorf("clearing claim: %w", err)
	}
	return nil
}

// QuarantineClaimParams is the claim as recovery scanned it, and why it
// is quarantined.
type QuarantineClaimParams struct {
	Claim  Claim
	Reason string
}

// QuarantineClaim marks the claim quarantined with p.Reason, by
// compare-and-swap on the values that were scanned (session, execution,
// token, expiry) and only when it is not quarantined already, so that later
// scans skip it until an operator releases it (recovery.Release).
// quarantined is false, and nothing is written, when the claim changed
// since it was scanned or is quarantined already. Recovery calls it for a
// quarantine decision and after a decision that failed.
func QuarantineClaim(ctx context.Context, tx pgx.Tx, p *QuarantineClaimParams) (quarantined bool, err error) {
	c := p.Claim
	tag, err := tx.Exec(ctx, quarantineClaimSQL, c.SessionID, c.ExecutionID, c.Token, expiryArg(c.ExpiresAt, c.ExpiresNotFinite), p.Reason)
	if err != nil {
		return false, fmt.Errorf("quarantining claim of %s: %w", c.SessionID, err)
	}
	return tag.RowsAffected() != 0, nil
}

// ReleaseClaimParams names the quarantined claim an operator releases.
type ReleaseClaimParams struct {
	SessionID string
	// QuarantinedAt, when not nil, releases the row only if its
	// quarantine began then: a caller that listed the row first (a bulk
	// release) leaves alone a row released and quarantined again since.
	// Defaults to any quarantine.
	QuarantinedAt *pgdb.Time
}

// ReleaseClaim lifts the quarantine of the session's claim and returns
// the reason it was quarantined for; found is false, and nothing is
// written, when the session has no quarantined claim. The caller audits the
// release and may still refuse it by rolling its transaction back
// (recovery.Release does when the claim still fails validation); the next
// recovery pass decides the claim.
func ReleaseClaim(ctx context.Context, tx pgx.Tx, p *ReleaseClaimParams) (reason string, found bool, err error) {
	err = tx.QueryRow(ctx, releaseQuarantinedClaimSQL, p.SessionID, p.QuarantinedAt).Scan(&reason)
	if errors.Is(interpretError(err), errNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("releasing the claim of %s: %w", p.SessionID, err)
	}
	return reason, true, nil
}

// ExpiredClaimsParams bounds and narrows a scan of expired claims.
type ExpiredClaimsParams struct {
	// Limit bounds the claims read.
	Limit int
	// SessionID keeps that session's claim only; "" keeps every session's.
	SessionID string
	// AfterExpiresAt, when not nil, keeps the claims after the position
	// (AfterExpiresAt, AfterSessionID) in the scan's order: a caller that
	// pages on past the claims it has seen.
	AfterExpiresAt *time.Time
	AfterSessionID string
	// AfterExpiresNotFinite, when not empty, is the position's expiry
	// instead of AfterExpiresAt (the last claim seen had one that is not a
	// time: Claim.ExpiresNotFinite).
	AfterExpiresNotFinite string
}

// ExpiredClaims reads the claims whose lease expired and that are not
// quarantined, at most p.Limit, in the order recovery handles them
// (expiry, then session): what a recovery pass decides on. A claim whose
// expires_at is not a time ('-infinity', 'infinity': Claim.ExpiresNotFinite)
// is read too, in the same order ('-infinity' first, 'infinity' last), for
// recovery to quarantine: it fails no scan, and a session held by a lease
// that never ends is not left held silently. q is the pool (a pass) or a
// transaction (a plan's snapshot).
func ExpiredClaims(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, p *ExpiredClaimsParams) ([]Claim, error) {
	var after *pgtype.Timestamptz
	switch {
	case p.AfterExpiresNotFinite != "":
		a := expiryArg(time.Time{}, p.AfterExpiresNotFinite)
		after = &a
	case p.AfterExpiresAt != nil:
		a := expiryArg(*p.AfterExpiresAt, "")
		after = &a
	}
	rows, err := q.Query(ctx, expiredClaimsSQL, p.Limit, p.SessionID, after, p.AfterSessionID)
	if err != nil {
		return nil, fmt.Errorf("scanning expired claims: %w", err)
	}
	var out []Claim
	var c Claim
	var phase string
	var expires pgtype.Timestamptz
	_, err = pgx.ForEachRow(rows, []any{&c.SessionID, &c.ExecutionID, &c.OwnerID, &c.Token, &phase, &c.AssistantMessageID, &expires}, func() error {
		c.Phase = Phase(phase)
		c.setExpiry(expires)
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scanning expired claims: %w", err)
	}
	return out, nil
}

// CountQuarantinedClaims counts the quarantined claims (the claim kind of
// the gauge promptline_quarantined_rows). The error is the driver's, for
// the caller to say what it was doing.
func CountQuarantinedClaims(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var n int
	if err := q.QueryRow(ctx, countQuarantinedClaimsSQL).Scan(&n); err != nil {
		return 0, err
	}
	return n, nil
}

// expiredClaimsSQL: a claim whose expires_at is not finite is never
// expired by the clock ('infinity') or expired since before any clock
// ('-infinity'); both are read, for recovery to quarantine them. The table
// is read whole either way (no index on expires_at: migration 00007).
const expiredClaimsSQL = `
SELECT session_id, execution_id, owner_id, fencing_token, phase, coalesce(assistant_message_id, ''), expires_at
FROM claims WHERE quarantine_reason IS NULL AND (expires_at <= now() OR NOT isfinite(expires_at)) AND ($2 = '' OR session_id = $2)
  AND ($3::timestamptz IS NULL OR (expires_at, session_id) > ($3::timestamptz, $4::text))
ORDER BY expires_at, session_id LIMIT $1`

const countQuarantinedClaimsSQL = `SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL`

// releaseQuarantinedClaimSQL returns the reason from before the update
// (RETURNING alone gives the new row's).
const releaseQuarantinedClaimSQL = `
WITH old AS (
    SELECT session_id, quarantine_reason FROM claims
    WHERE session_id = $1 AND quarantine_reason IS NOT NULL
      AND ($2::timestamptz IS NULL OR quarantined_at = $2) FOR UPDATE
)
UPDATE claims c SET quarantine_reason = NULL, quarantined_at = NULL
FROM old WHERE c.session_id = old.session_id
RETURNING old.quarantine_reason`

const rearmIdempotentCallsSQL = `
UPDATE tool_calls SET state = 'requested', started_at = NULL
WHERE session_id = $1 AND state = 'started' AND class = 'idempotent'`

const settleRetriedAttemptSQL = `
UPDATE attempts SET state = 'failed', error = coalesce(error, '') || '; sent again with the same idempotency key by recovery', finished_at = now()
WHERE attempt_id = $1 AND state = 'retry_wait'`

const settleDeferredAttemptsSQL = `
UPDATE attempts SET state = 'failed', error = coalesce(error, '') || '; not sent: continued by recovery', finished_at = now()
WHERE execution_id = $1 AND state = 'retry_wait'`

const reconcileAttemptsSQL = `
UPDATE attempts SET state = 'unknown', error = $2, finished_at = now()
WHERE execution_id = $1 AND state IN ('started', 'retry_wait')`

// reconcileCallsSQL returns the calls' new states: RETURNING reads the
// row as updated.
const reconcileCallsSQL = `
WITH settled AS (
    UPDATE tool_calls SET state = CASE state WHEN 'started' THEN 'unknown' ELSE 'interrupted' END,
    output = CASE state WHEN 'started' THEN $2 ELSE 'interrupted: never dispatched' END, is_error = true, finished_at = now()
    WHERE session_id = $1 AND state IN ('requested', 'started')
    RETURNING call_id, model_call_id, tool, class, state, requested_at, attempt_id, idx)
SELECT call_id, model_call_id, tool, class, state FROM settled ORDER BY requested_at, attempt_id, idx`

const quarantineClaimSQL = `
UPDATE claims SET quarantine_reason = $5, quarantined_at = now()
WHERE session_id = $1 AND execution_id = $2 AND fencing_token = $3 AND expires_at = $4 AND quarantine_reason IS NULL`
