package transcript

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ToolMessageParams are a tool call's result message. Its text is a part
// of its own (InsertPart, InsertTextPart), written in the same
// transaction.
type ToolMessageParams struct {
	ID          string // the call's ID
	SessionID   string
	ToolCallID  string // the model's ID for the call
	ExecutionID string
	Token       int64
	IsError     bool
}

// InsertToolMessage creates a call's tool message, completed.
func InsertToolMessage(ctx context.Context, tx pgx.Tx, p *ToolMessageParams) error {
	_, err := tx.Exec(ctx, insertToolMessageSQL, p.ID, p.SessionID, p.ToolCallID, p.IsError, p.ExecutionID, p.Token)
	return err
}

// ResolvedToolMessageParams are the tool message of a call an operator
// found ran: it succeeded, so the message is never an error.
type ResolvedToolMessageParams struct {
	ID          string
	SessionID   string
	ToolCallID  string
	ExecutionID string
	Token       int64
}

// UpsertResolvedToolMessage stores the tool message of a call an operator
// found ran: created completed and not an error or, when the call has one
// (its unknown result), that one becomes so.
func UpsertResolvedToolMessage(ctx context.Context, tx pgx.Tx, p *ResolvedToolMessageParams) error {
	_, err := tx.Exec(ctx, upsertResolvedToolMessageSQL, p.ID, p.SessionID, p.ToolCallID, p.ExecutionID, p.Token)
	return err
}

// DeleteToolMessageParams name a call's tool message.
type DeleteToolMessageParams struct {
	MessageID string
}

// DeleteToolMessage removes a call's tool message (only a tool message:
// an ID of another role is left alone); its parts go first (DeleteParts).
func DeleteToolMessage(ctx context.Context, tx pgx.Tx, p *DeleteToolMessageParams) error {
	_, err := tx.Exec(ctx, deleteToolMessageSQL, p.MessageID)
	return err
}

const insertToolMessageSQL = `
INSERT INTO messages (message_id, session_id, role, status, tool_call_id, is_error, completed_at, execution_id, fencing_token)
VALUES ($1, $2, 'tool', 'completed', $3, $4, now(), $5, $6)`

const upsertResolvedToolMessageSQL = `
INSERT INTO messages (message_id, session_id, role, status, tool_call_id, is_error, completed_at, execution_id, fencing_token)
VALUES ($1, $2, 'tool', 'completed', $3, false, now(), $4, $5)
ON CONFLICT (message_id) DO UPDATE SET is_error = false, status = 'completed', completed_at = now()`

const deleteToolMessageSQL = `DELETE FROM messages WHERE message_id = $1 AND role = 'tool'`
