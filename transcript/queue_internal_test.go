package transcript

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestQueueForms holds the queued forms to the hot path's promise: each
// adds one statement, the Exec form's, with the same arguments in the same
// order, so a queued write sends what it sent before the move.
func TestQueueForms(t *testing.T) {
	t.Parallel()
	b := &pgx.Batch{}
	QueueInsertAssistant(b, &InsertAssistantParams{ID: "a", SessionID: "s", Answers: []string{"in"}, ExecutionID: "e", Token: 3, TurnID: "t"})
	QueueAnswer(b, &AnswerParams{MessageID: "a", Text: "hi"})
	require.Len(t, b.QueuedQueries, 2)
	require.Equal(t, insertAssistantSQL, b.QueuedQueries[0].SQL)
	require.Equal(t, []any{"a", "s", []string{"in"}, "e", int64(3), "t"}, b.QueuedQueries[0].Arguments)
	require.Equal(t, answerSQL, b.QueuedQueries[1].SQL)
	require.Equal(t, []any{"a", "hi"}, b.QueuedQueries[1].Arguments)
}
