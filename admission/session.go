package admission

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The statements on sessions that other packages make in their own
// transactions: the session row lock that every writer that admits to a
// session, releases its claim or decides on its waiting inputs takes
// first (docs/design.md, invariant 7: admission upserts the row, release,
// recovery and an operator's resolution lock it; the executor's writes
// that cannot release open with the fence alone, so they run beside an
// admission), the fencing token a takeover raises (ledger), and the
// redrive's mark.
// Admission itself locks its batches' sessions in lockSessionsSQL, in
// byte order (the ledger's group commit locks in the same order).

// LockSessionParams names the session whose row is locked.
type LockSessionParams struct {
	SessionID string
}

// LockSession locks the session's row (FOR UPDATE) until the caller's
// transaction ends, and returns its fencing token as locked; found is
// false when the row does not exist: a missing session locks nothing and
// is not an error, so that a caller that needs the session says so in its
// own words. The error is the driver's, for the caller to say what it was
// doing.
func LockSession(ctx context.Context, tx pgx.Tx, p *LockSessionParams) (token int64, found bool, err error) {
	err = tx.QueryRow(ctx, lockSessionSQL, p.SessionID).Scan(&token)
	if errors.Is(interpretError(err), errNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return token, true, nil
}

// BumpFencingTokenParams names the session whose fencing token a takeover
// raised, and the token.
type BumpFencingTokenParams struct {
	SessionID string
	Token     int64
}

// BumpFencingToken raises the session's fencing token to p.Token, never
// lowers it: the token the claims of the session take next starts above
// every token handed out (ledger's Takeover, under the session's lock).
// The error is the driver's, for the caller to say what it was doing.
func BumpFencingToken(ctx context.Context, tx pgx.Tx, p *BumpFencingTokenParams) error {
	_, err := tx.Exec(ctx, bumpFencingTokenSQL, p.SessionID, p.Token)
	return err
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

const lockSessionSQL = `SELECT fencing_token FROM sessions WHERE session_id = $1 FOR UPDATE`

const bumpFencingTokenSQL = `UPDATE sessions SET fencing_token = $2 WHERE session_id = $1 AND fencing_token < $2`

const markRedrivenSQL = `UPDATE sessions SET redriven_at = now() WHERE session_id = ANY($1)`
