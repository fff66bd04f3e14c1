package transcript

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Kinds of message part.
const (
	PartText     = "text"
	PartToolCall = "tool_call" // a tool call the model requested, as JSON
)

// PartParams are one part of a message.
type PartParams struct {
	MessageID string
	Index     int // 0 is the text; an assistant message's tool calls follow from 1
	Kind      string
	Body      string
}

// InsertPart stores a part of a message.
func InsertPart(ctx context.Context, tx pgx.Tx, p *PartParams) error {
	_, err := tx.Exec(ctx, insertPartSQL, p.MessageID, p.Index, p.Kind, p.Body)
	return err
}

// TextPartParams are a message's text, its part 0.
type TextPartParams struct {
	MessageID string
	Body      string
}

// InsertTextPart stores a message's text as its part 0.
func InsertTextPart(ctx context.Context, tx pgx.Tx, p *TextPartParams) error {
	_, err := tx.Exec(ctx, insertTextPartSQL, p.MessageID, p.Body)
	return err
}

// DeletePartsParams name the message whose parts go.
type DeletePartsParams struct {
	MessageID string
}

// DeleteParts removes every part of a message.
func DeleteParts(ctx context.Context, tx pgx.Tx, p *DeletePartsParams) error {
	_, err := tx.Exec(ctx, deletePartsSQL, p.MessageID)
	return err
}

const insertPartSQL = `INSERT INTO message_parts (message_id, idx, kind, body) VALUES ($1, $2, $3, $4)`

const insertTextPartSQL = `INSERT INTO message_parts (message_id, idx, kind, body) VALUES ($1, 0, 'text', $2)`

const deletePartsSQL = `DELETE FROM message_parts WHERE message_id = $1`
