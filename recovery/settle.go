package recovery

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// FindVoucherParams names a continuation input by its message ID.
type FindVoucherParams struct {
	ContinuationID string
}

// Voucher is the recovery, or the operator's resolution (consumer
// session resolve), that admitted a continuation input: what the
// executor continues when it promotes the input.
type Voucher struct {
	// SessionID is the session whose recovery or resolution it is.
	SessionID string
	// AssistantMessageID is the assistant message of the turn continued;
	// "" when a recovery's evidence names none.
	AssistantMessageID string
	// RetryAttemptID is the deferred attempt the continuation sends again
	// under its idempotency key; "" for none (always, for a resolution).
	RetryAttemptID string
}

// FindVoucher reads the recovery or the resolution that admitted the
// continuation p names, settled or not, in the caller's transaction;
// found is false when neither did (a continuation input nothing vouches
// for, which the executor quarantines).
func FindVoucher(ctx context.Context, tx pgx.Tx, p *FindVoucherParams) (v Voucher, found bool, err error) {
	err = tx.QueryRow(ctx, findVoucherSQL, p.ContinuationID).Scan(&v.SessionID, &v.AssistantMessageID, &v.RetryAttemptID)
	if errors.Is(interpretError(err), errNotFound) {
		return Voucher{}, false, nil
	}
	if err != nil {
		return Voucher{}, false, fmt.Errorf("reading recovery of %s: %w", p.ContinuationID, err)
	}
	return v, true, nil
}

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

// findVoucherSQL: recovery vouches for its continuations, an operator's
// resolution for its own.
const findVoucherSQL = `SELECT session_id, coalesce(evidence->>'assistant_message_id', ''), coalesce(retry_attempt_id, '')
		FROM recoveries WHERE continuation_message_id = $1
		UNION ALL
		SELECT session_id, assistant_message_id, '' FROM resolutions WHERE continuation_message_id = $1`

const settleRecoverySQL = `UPDATE recoveries SET settled_at = now()
		WHERE session_id = $1 AND continuation_message_id = $2 AND settled_at IS NULL`

const settleResolutionSQL = `UPDATE resolutions SET settled_at = now()
		WHERE session_id = $1 AND continuation_message_id = $2 AND settled_at IS NULL`
