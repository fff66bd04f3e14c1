package recovery

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SettleContinuationParams names a continuation input as its promotion
// finds it: its session and its message ID.
type SettleContinuationParams struct {
	SessionID      string
	ContinuationID string
}

// SettleContinuation marks settled the recovery and the operator's
// resolution (whichever admitted it) whose continuation is p's, in the
// transaction that promotes the continuation. Only the rows of p's session
// not settled before are touched: replaying the same events settles
// nothing twice.
func SettleContinuation(ctx context.Context, tx pgx.Tx, p *SettleContinuationParams) error {
	if _, err := tx.Exec(ctx, settleRecoverySQL, p.SessionID, p.ContinuationID); err != nil {
		return fmt.Errorf("settling recovery of %s: %w", p.ContinuationID, err)
	}
	if _, err := tx.Exec(ctx, settleResolutionSQL, p.SessionID, p.ContinuationID); err != nil {
		return fmt.Errorf("settling resolution of %s: %w", p.ContinuationID, err)
	}
	return nil
}

const settleRecoverySQL = `UPDATE recoveries SET settled_at = now()
		WHERE session_id = $1 AND continuation_message_id = $2 AND settled_at IS NULL`

const settleResolutionSQL = `UPDATE resolutions SET settled_at = now()
		WHERE session_id = $1 AND continuation_message_id = $2 AND settled_at IS NULL`
