package transcript

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// InsertAssistantParams are a step's assistant message, created pending.
type InsertAssistantParams struct {
	ID          string
	SessionID   string
	Answers     []string // the turn's input message IDs
	ExecutionID string
	Token       int64 // the fencing token of the claim that writes it
	TurnID      string
}

// InsertAssistant creates a pending assistant message; one with the same
// ID is an error (a unique violation).
func InsertAssistant(ctx context.Context, tx pgx.Tx, p *InsertAssistantParams) error {
	_, err := tx.Exec(ctx, insertAssistantSQL, p.ID, p.SessionID, p.Answers, p.ExecutionID, p.Token, p.TurnID)
	return err
}

// InsertAssistantIfAbsent creates a pending assistant message unless one
// with that ID exists, which it leaves as it is.
func InsertAssistantIfAbsent(ctx context.Context, tx pgx.Tx, p *InsertAssistantParams) error {
	_, err := tx.Exec(ctx, insertAssistantIfAbsentSQL, p.ID, p.SessionID, p.Answers, p.ExecutionID, p.Token, p.TurnID)
	return err
}

// InsertErroredAssistantParams are an assistant message created errored:
// the one a failed turn names when it has none of its own left to name.
type InsertErroredAssistantParams struct {
	ID          string
	SessionID   string
	Answers     []string
	ExecutionID string
	Token       int64
	TurnID      string
	Error       string
}

// InsertErroredAssistant creates an errored assistant message.
func InsertErroredAssistant(ctx context.Context, tx pgx.Tx, p *InsertErroredAssistantParams) error {
	_, err := tx.Exec(ctx, insertErroredAssistantSQL, p.ID, p.SessionID, p.Answers, p.ExecutionID, p.Token, p.TurnID, p.Error)
	return err
}

// AnswerParams are a step's answer without tool calls.
type AnswerParams struct {
	MessageID string
	Text      string // stored as part 0; none when empty
}

// Answer stores the answer's text and completes its assistant message, if
// pending.
func Answer(ctx context.Context, tx pgx.Tx, p *AnswerParams) error {
	_, err := tx.Exec(ctx, answerSQL, p.MessageID, p.Text)
	return err
}

// CompleteParams name the assistant message to complete.
type CompleteParams struct {
	MessageID string
}

// Complete completes an assistant message whose parts are stored, if
// pending.
func Complete(ctx context.Context, tx pgx.Tx, p *CompleteParams) error {
	_, err := tx.Exec(ctx, completeMessageSQL, p.MessageID)
	return err
}

// FailAssistantParams are a failed turn's assistant message and why it
// failed.
type FailAssistantParams struct {
	MessageID string
	Error     string
}

// FailAssistant marks an assistant message errored with p.Error, if
// pending: the one rule by which a turn's message fails, whether the
// executor fails the turn or recovery reconciles it. A completed or
// errored message is left as it is.
func FailAssistant(ctx context.Context, tx pgx.Tx, p *FailAssistantParams) error {
	_, err := tx.Exec(ctx, failAssistantSQL, p.MessageID, p.Error)
	return err
}

const insertAssistantSQL = `
INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id)
VALUES ($1, $2, 'assistant', 'pending', $3, $4, $5, $6)`

const insertAssistantIfAbsentSQL = insertAssistantSQL + ` ON CONFLICT (message_id) DO NOTHING`

const insertErroredAssistantSQL = `INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id, error, completed_at)
		VALUES ($1, $2, 'assistant', 'errored', $3, $4, $5, $6, $7, now())`

// answerSQL stores an answer's text (none when empty) and completes its
// assistant message.
const answerSQL = `
WITH p AS (
    INSERT INTO message_parts (message_id, idx, kind, body) SELECT $1, 0, 'text', $2::text WHERE $2::text <> ''
)
UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = $1 AND status = 'pending'`

const completeMessageSQL = `
UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = $1 AND status = 'pending'`

const failAssistantSQL = `
UPDATE messages SET status = 'errored', error = $2, completed_at = now()
WHERE message_id = $1 AND status = 'pending'`
