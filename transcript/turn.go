package transcript

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/provider"
)

// What the executor reads back of a turn, in its claim's transaction:
// the turn a continuation or a resumed ask continues (its assistant
// message, its inputs, the steps it completed) and, before failing a
// turn, whether its message failed already. And what an operator's
// resolution reads of the turn of the call or attempt it settles, in its
// transaction: whether a newer step superseded it, and the turn's ID for
// the event it writes. Errors are the driver's, for the caller to say
// what it was doing.

// AssistantTurnParams names an assistant message.
type AssistantTurnParams struct {
	MessageID string
}

// AssistantTurn is what an assistant message records of its turn.
type AssistantTurn struct {
	Answers []string // the turn's input message IDs
	// TurnID is the turn's ID; "" for a message written before turns had
	// IDs (migration 00003), whose turn is named by the message itself.
	TurnID string
	Status string // pending, completed or errored
}

// ReadAssistantTurn reads the turn of an assistant message. A message
// that does not exist is an error: the caller names a message its claim
// or a request recorded.
func ReadAssistantTurn(ctx context.Context, tx pgx.Tx, p *AssistantTurnParams) (AssistantTurn, error) {
	var a AssistantTurn
	var turnID *string
	if err := tx.QueryRow(ctx, assistantTurnSQL, p.MessageID).Scan(&a.Answers, &turnID, &a.Status); err != nil {
		return AssistantTurn{}, err
	}
	if turnID != nil {
		a.TurnID = *turnID
	}
	return a, nil
}

// TurnInputsParams names a turn's inputs: the answers of its assistant
// message.
type TurnInputsParams struct {
	MessageIDs []string
}

// TurnInputs reads a turn's inputs as a provider sees them: user
// messages, each with the text of its parts joined, in transcript order.
// IDs with no message are left out.
func TurnInputs(ctx context.Context, tx pgx.Tx, p *TurnInputsParams) ([]provider.TranscriptMessage, error) {
	rows, err := tx.Query(ctx, turnInputsSQL, p.MessageIDs)
	if err != nil {
		return nil, err
	}
	var out []provider.TranscriptMessage
	m := provider.TranscriptMessage{Role: "user"}
	if _, err := pgx.ForEachRow(rows, []any{&m.ID, &m.Text}, func() error {
		out = append(out, m)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// CompletedStepsParams names a session's turn, and the assistant message
// of the step about to run, which is not counted.
type CompletedStepsParams struct {
	SessionID       string
	TurnID          string
	ExceptMessageID string
}

// CompletedSteps counts the turn's completed assistant messages (each a
// step announced by its step.completed) other than p.ExceptMessageID:
// the number a continuation's steps go on counting from. p.TurnID names
// the turn as ReadTurnID does: a message without turn_id is its own.
func CompletedSteps(ctx context.Context, tx pgx.Tx, p *CompletedStepsParams) (int, error) {
	var n int
	if err := tx.QueryRow(ctx, completedStepsSQL, p.SessionID, p.TurnID, p.ExceptMessageID).Scan(&n); err != nil {
		return 0, err
	}
	return n, nil
}

// MessageStatusParams names a message.
type MessageStatusParams struct {
	MessageID string
}

// MessageStatus reads a message's status (pending, completed or
// errored); found is false when there is no such message (a step that
// never began has none).
func MessageStatus(ctx context.Context, tx pgx.Tx, p *MessageStatusParams) (status string, found bool, err error) {
	err = tx.QueryRow(ctx, messageStatusSQL, p.MessageID).Scan(&status)
	if errors.Is(interpretError(err), errNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return status, true, nil
}

// TurnIDParams names a message.
type TurnIDParams struct {
	MessageID string
}

// ReadTurnID reads the ID of a message's turn: the message's own ID for
// one written before turns had IDs (migration 00003). A message that does
// not exist is an error: the caller names one the ledger recorded.
func ReadTurnID(ctx context.Context, tx pgx.Tx, p *TurnIDParams) (string, error) {
	var turnID string
	if err := tx.QueryRow(ctx, turnIDSQL, p.MessageID).Scan(&turnID); err != nil {
		return "", err
	}
	return turnID, nil
}

// NewerStepParams names the assistant message of a step.
type NewerStepParams struct {
	MessageID string
}

// NewerStep is the newest assistant message of a session written after a
// step's.
type NewerStep struct {
	MessageID string
	// SameTurn says that it is a later step of the step's own turn: the
	// turn went on past the step.
	SameTurn bool
}

// ReadNewerStep reads the session's newest assistant message written
// after p.MessageID, other than the errored rest of the same turn (a turn
// that failed after the step); found is false when there is none, or no
// message p.MessageID: nothing supersedes the step.
func ReadNewerStep(ctx context.Context, tx pgx.Tx, p *NewerStepParams) (n NewerStep, found bool, err error) {
	err = tx.QueryRow(ctx, newerStepSQL, p.MessageID).Scan(&n.MessageID, &n.SameTurn)
	if errors.Is(interpretError(err), errNotFound) {
		return NewerStep{}, false, nil
	}
	if err != nil {
		return NewerStep{}, false, err
	}
	return n, true, nil
}

const assistantTurnSQL = `SELECT coalesce(answers, '{}'), turn_id, status FROM messages WHERE message_id = $1`

const turnInputsSQL = `SELECT m.message_id, coalesce(string_agg(p.body, '' ORDER BY p.idx), '')
		FROM messages m LEFT JOIN LATERAL ` + partsOf + ` ON true
		WHERE m.message_id = ANY($1) GROUP BY m.message_id, m.seq ORDER BY m.seq`

// A message's turn is coalesce(turn_id, message_id), here and in every
// statement that compares turns (ledger's laterUnknownSQL too): a message
// written before migration 00003 has no turn_id and was a turn of its own
// (there were no tool steps), and the rest of such a turn, written later
// (a continuation's step, recovery's errored message), carries its ID as
// turn_id (ReadTurnID, the executor's continueTurn, recovery's apply).
// Compared raw, two legacy messages (NULL and NULL) would be one turn and
// the rest of a legacy turn (its ID and NULL) another.

const completedStepsSQL = `SELECT count(*) FROM messages
		WHERE session_id = $1 AND coalesce(turn_id, message_id) = $2 AND role = 'assistant' AND status = 'completed' AND message_id <> $3`

const messageStatusSQL = `SELECT status FROM messages WHERE message_id = $1`

const turnIDSQL = `SELECT coalesce(turn_id, message_id) FROM messages WHERE message_id = $1`

const newerStepSQL = `SELECT n.message_id, coalesce(n.turn_id, n.message_id) = coalesce(m.turn_id, m.message_id) FROM messages n, messages m
		WHERE m.message_id = $1 AND n.session_id = m.session_id AND n.role = 'assistant' AND n.seq > m.seq
		  AND NOT (n.status = 'errored' AND coalesce(n.turn_id, n.message_id) = coalesce(m.turn_id, m.message_id))
		ORDER BY n.seq DESC LIMIT 1`
