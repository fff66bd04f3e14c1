package admission

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The statements on sessions that other packages make in their own
// transactions: the session row lock that every writer of a session takes
// first (docs/design.md, invariant 7: admission upserts the row, release,
// recovery and an operator's resolution lock it), and the redrive's mark.
// Admission itself locks its batches' sessions in lockSessionsSQL, in
// sorted order.

// LockSessionParams names the session whose row is locked.
type LockSessionParams struct {
	SessionID string
}

// LockSession locks the session's row (FOR UPDATE) until the caller's
// transaction ends, and reports whether the row exists: a missing session
// locks nothing and is not an error, so that a caller that needs the
// session says so in its own words. The error is the driver's, for the
// caller to say what it was doing.
func LockSession(ctx context.Context, tx pgx.Tx, p *LockSessionParams) (found bool, err error) {
	var one int
	err = tx.QueryRow(ctx, lockSessionSQL, p.SessionID).Scan(&one)
	if errors.Is(interpretError(err), errNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// MarkRedrivenParams names the sessions whose wake a redrive re-sends.
type MarkRedrivenParams struct {
	SessionIDs []string
}

// MarkRedriven sets redriven_at to now on the named sessions, and on no
// other: the redrive scan skips them for its interval. The error is the
// driver's, for the caller to say what it was doing.
func MarkRedriven(ctx context.Context, tx pgx.Tx, p *MarkRedrivenParams) error {
	_, err := tx.Exec(ctx, markRedrivenSQL, p.SessionIDs)
	return err
}

const lockSessionSQL = `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`

const markRedrivenSQL = `UPDATE sessions SET redriven_at = now() WHERE session_id = ANY($1)`
