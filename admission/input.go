package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/pgdb"
)

// The writes to inputs that other packages make in their own
// transactions: recovery admits continuation inputs, the executor
// promotes and quarantines the inputs it selects. Each runs one statement
// in the caller's transaction; the policy (which ID to try next, what
// reason to give) stays with the caller. So do the reads recovery makes
// of inputs: whether a continuation waits, before an operator's
// resolution admits one, and how many inputs are quarantined, for the
// gauge.

// AdmitContinuationParams names a continuation input: its message ID, its
// session and the hash of what it continues (which recovery or resolution
// admitted it).
type AdmitContinuationParams struct {
	MessageID   string
	SessionID   string
	PayloadHash []byte
}

// Holder is the input that holds a message ID.
type Holder struct {
	MessageID   string
	SessionID   string
	Kind        string
	PayloadHash []byte
}

// Is reports whether h is the continuation input that p names: same
// kind, session and payload. A second admission of that input is an exact
// retry.
func (h Holder) Is(p *AdmitContinuationParams) bool {
	return h.Kind == KindContinuation && h.SessionID == p.SessionID && bytes.Equal(h.PayloadHash, p.PayloadHash)
}

// AdmitContinuation admits a continuation input (kind continuation, a
// steer, wake pending) under p.MessageID unless an input holds that ID
// already, and returns the input that holds it afterwards: the one it
// admitted, the same input admitted before (an exact retry), or another
// input (of another session, kind or payload), whose ID is then not this
// one's to take (Holder.Is tells).
func AdmitContinuation(ctx context.Context, tx pgx.Tx, p *AdmitContinuationParams) (Holder, error) {
	var h Holder
	if err := tx.QueryRow(ctx, admitContinuationSQL, p.MessageID, p.SessionID, p.PayloadHash).Scan(&h.MessageID, &h.SessionID, &h.Kind, &h.PayloadHash); err != nil {
		return Holder{}, fmt.Errorf("admitting continuation %s: %w", p.MessageID, err)
	}
	return h, nil
}

// PromoteInputParams names the input to promote.
type PromoteInputParams struct {
	MessageID string
}

// PromoteInput gives a waiting input its promotion order (once: an input
// promoted before keeps its order).
func PromoteInput(ctx context.Context, tx pgx.Tx, p *PromoteInputParams) error {
	if _, err := tx.Exec(ctx, promoteInputSQL, p.MessageID); err != nil {
		return fmt.Errorf("promoting %s: %w", p.MessageID, err)
	}
	return nil
}

// QuarantineInputParams names the input to quarantine and says why.
type QuarantineInputParams struct {
	MessageID string
	Reason    string
}

// QuarantineInput quarantines an input with its reason: it no longer
// waits (waiting_inputs) until an operator releases it. The error is the
// driver's, for the caller to say what it was doing.
func QuarantineInput(ctx context.Context, tx pgx.Tx, p *QuarantineInputParams) error {
	_, err := tx.Exec(ctx, quarantineInputSQL, p.MessageID, p.Reason)
	return err
}

// ReleaseInputParams names the quarantined input an operator releases.
type ReleaseInputParams struct {
	MessageID string
	// QuarantinedAt, when not nil, releases the row only if its
	// quarantine began then: a caller that listed the row first (a bulk
	// release) leaves alone a row released and quarantined again since.
	// Defaults to any quarantine.
	QuarantinedAt *pgdb.Time
}

// ReleasedInput is what ReleaseInput lifted.
type ReleasedInput struct {
	SessionID string
	// Reason is the one the input was quarantined for.
	Reason string
	// Waiting: the input waits again (waiting_inputs), and needs a wake
	// unless a claim holds its session.
	Waiting bool
}

// ReleaseInput lifts the quarantine of an input; found is false, and
// nothing is written, when no quarantined input has that ID. The caller
// holds the session's row lock (LockSession, invariant 7), audits the
// release and writes the wake it needs.
func ReleaseInput(ctx context.Context, tx pgx.Tx, p *ReleaseInputParams) (r ReleasedInput, found bool, err error) {
	err = tx.QueryRow(ctx, releaseInputSQL, p.MessageID, p.QuarantinedAt).Scan(&r.SessionID, &r.Reason)
	if errors.Is(interpretError(err), errNotFound) {
		return ReleasedInput{}, false, nil
	}
	if err != nil {
		return ReleasedInput{}, false, fmt.Errorf("releasing input %s: %w", p.MessageID, err)
	}
	// A statement of its own: the update's snapshot would not see itself.
	if err := tx.QueryRow(ctx, inputWaitsSQL, p.MessageID).Scan(&r.Waiting); err != nil {
		return ReleasedInput{}, false, fmt.Errorf("releasing input %s: %w", p.MessageID, err)
	}
	return r, true, nil
}

// InputSession returns the session of the input with that ID; found is
// false when there is none. It reads without locking: a caller that needs
// the session's row lock takes it with the session this returns.
func InputSession(ctx context.Context, tx pgx.Tx, messageID string) (session string, found bool, err error) {
	err = tx.QueryRow(ctx, inputSessionSQL, messageID).Scan(&session)
	if errors.Is(interpretError(err), errNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading the session of input %s: %w", messageID, err)
	}
	return session, true, nil
}

// WaitingContinuationParams names a session.
type WaitingContinuationParams struct {
	SessionID string
}

// WaitingContinuation returns the least message ID of the session's
// continuations and permission replies that wait (waiting_inputs), ""
// when none does: an input that continues a turn of the session. The
// error is the driver's, for the caller to say what it was doing.
func WaitingContinuation(ctx context.Context, tx pgx.Tx, p *WaitingContinuationParams) (string, error) {
	var id string
	if err := tx.QueryRow(ctx, waitingContinuationSQL, p.SessionID).Scan(&id); err != nil {
		return "", err
	}
	return id, nil
}

// CountQuarantinedInputs counts the quarantined inputs (the input kind of
// the gauge promptline_quarantined_rows); q is the pool or a transaction.
// The error is the driver's, for the caller to say what it was doing.
func CountQuarantinedInputs(ctx context.Context, q RowQuerier) (int, error) {
	var n int
	if err := q.QueryRow(ctx, countQuarantinedInputsSQL).Scan(&n); err != nil {
		return 0, err
	}
	return n, nil
}

// releaseInputSQL returns the row from before the update (RETURNING alone
// gives the new row's).
const releaseInputSQL = `
WITH old AS (
    SELECT message_id, session_id, quarantine_reason FROM inputs
    WHERE message_id = $1 AND quarantine_reason IS NOT NULL
      AND ($2::timestamptz IS NULL OR quarantined_at = $2) FOR UPDATE
)
UPDATE inputs i SET quarantine_reason = NULL, quarantined_at = NULL
FROM old WHERE i.message_id = old.message_id
RETURNING old.session_id, old.quarantine_reason`

const inputWaitsSQL = `SELECT EXISTS (SELECT 1 FROM waiting_inputs WHERE message_id = $1)`

const waitingContinuationSQL = `SELECT coalesce(min(message_id), '') FROM waiting_inputs
			WHERE session_id = $1 AND kind IN ('continuation', 'permission_reply')`

const countQuarantinedInputsSQL = `SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL`

const inputSessionSQL = `SELECT session_id FROM inputs WHERE message_id = $1`

// The DO UPDATE (a no-op) makes RETURNING give the holder's row when the
// ID is held, in the same statement.
const admitContinuationSQL = `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, $2, '', $3, 'steer', true, 'continuation')
			ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id
			RETURNING message_id, session_id, kind, payload_hash`

const promoteInputSQL = `UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now()
		WHERE message_id = $1 AND promotion_seq IS NULL`

const quarantineInputSQL = `UPDATE inputs SET quarantine_reason = $2, quarantined_at = now() WHERE message_id = $1`
