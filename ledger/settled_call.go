package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SettledCall is a tool call settled in bulk, as InterruptCalls and
// ReconcileCalls return it: what its tool.completed announces.
type SettledCall struct {
	ID          string
	ModelCallID string
	Tool        string
	Class       string
	State       CallState // the state it was settled in
}

// InterruptCallsParams names the session whose requested tool calls end
// interrupted, and the output they get.
type InterruptCallsParams struct {
	SessionID string
	Output    string
}

// InterruptCalls settles every requested (never dispatched) tool call of
// the session as interrupted, an error with p.Output: they will never run.
// Started calls are left alone (their outcome is the tool's, or recovery's
// to reconcile). It returns the calls it settled, in the order they were
// requested (request time, attempt, index), the order their tool.completed
// is announced in. The executor calls it inside a failing turn's Finish
// transaction, behind the fence.
func InterruptCalls(ctx context.Context, tx pgx.Tx, p *InterruptCallsParams) ([]SettledCall, error) {
	rows, err := tx.Query(ctx, interruptCallsSQL, p.SessionID, p.Output)
	if err != nil {
		return nil, fmt.Errorf("interrupting calls not run: %w", err)
	}
	var calls []SettledCall
	c := SettledCall{State: CallInterrupted}
	if _, err := pgx.ForEachRow(rows, []any{&c.ID, &c.ModelCallID, &c.Tool, &c.Class}, func() error {
		calls = append(calls, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("interrupting calls not run: %w", err)
	}
	return calls, nil
}

// interruptCallsSQL settles requested calls only: every row it returns
// is interrupted.
const interruptCallsSQL = `
WITH interrupted AS (
    UPDATE tool_calls SET state = 'interrupted', output = $2, is_error = true, finished_at = now()
    WHERE session_id = $1 AND state = 'requested'
    RETURNING call_id, model_call_id, tool, class, requested_at, attempt_id, idx)
SELECT call_id, model_call_id, tool, class FROM interrupted ORDER BY requested_at, attempt_id, idx`
