package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// What the executor reads of the ledger when it continues a turn (a
// recovery's or a resolution's continuation, a resumed ask), in the
// claim's transaction that promotes the input: the key of the attempt it
// sends again and the calls the session left requested.

// AttemptKeyParams names a provider attempt.
type AttemptKeyParams struct {
	AttemptID string
}

// AttemptKey reads the idempotency key of an attempt: a continuation that
// sends a deferred attempt again sends it under the same key, so that a
// provider that honours keys acts once. An attempt that does not exist is
// an error: the caller names one that recovery recorded.
func AttemptKey(ctx context.Context, tx pgx.Tx, p *AttemptKeyParams) (string, error) {
	var key string
	if err := tx.QueryRow(ctx, attemptKeySQL, p.AttemptID).Scan(&key); err != nil {
		return "", fmt.Errorf("reading attempt %s: %w", p.AttemptID, err)
	}
	return key, nil
}

// RequestedCallsParams names the session whose requested calls are read.
type RequestedCallsParams struct {
	SessionID string
}

// RequestedCalls reads the session's tool calls still requested (never
// dispatched), in the order they were requested (request time, attempt,
// index): the calls a continued turn runs before its next step.
func RequestedCalls(ctx context.Context, tx pgx.Tx, p *RequestedCallsParams) ([]CallParams, error) {
	rows, err := tx.Query(ctx, requestedCallsSQL, p.SessionID)
	if err != nil {
		return nil, fmt.Errorf("reading requested tool calls: %w", err)
	}
	var calls []CallParams
	var c CallParams
	var input []byte
	if _, err := pgx.ForEachRow(rows, []any{&c.ID, &c.AttemptID, &c.Index, &c.ModelCallID, &c.Tool, &c.Class, &input, &c.IdempotencyKey}, func() error {
		// The driver reuses input's buffer for the next row.
		c.Input = json.RawMessage(append([]byte(nil), input...))
		calls = append(calls, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading requested tool calls: %w", err)
	}
	return calls, nil
}

const attemptKeySQL = `SELECT idempotency_key FROM attempts WHERE attempt_id = $1`

const requestedCallsSQL = `SELECT call_id, attempt_id, idx, model_call_id, tool, class, input, idempotency_key
		FROM tool_calls WHERE session_id = $1 AND state = 'requested' ORDER BY requested_at, attempt_id, idx`
