package transcript_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/transcript"
)

// A tool-call part that does not decode fails the history read, naming
// the part, whether it is read alone (History), queued in a batch
// (QueueHistory: handed to the caller, the batch's other statements
// standing) or checked (CheckHistory, recovery's evidence); the check
// judges exactly the parts the read decodes.
func TestHistoryOfAnUnreadablePart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// seed writes u1, a completed assistant message a1 with its text and
	// two tool calls, their results, and a pending step a2 with a call.
	seed := func(t *testing.T, b *testBundle) {
		t.Helper()
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('u1', 's', 'user', 'completed')`); err != nil {
				return err
			}
			if err := transcript.InsertTextPart(ctx, tx, &transcript.TextPartParams{MessageID: "u1", Body: "go"}); err != nil {
				return err
			}
			for _, id := range []string{"a1", "a2"} {
				if err := transcript.InsertAssistant(ctx, tx, assistant(id)); err != nil {
					return err
				}
			}
			parts := []transcript.PartParams{
				{MessageID: "a1", Index: 0, Kind: transcript.PartText, Body: "calling"},
				{MessageID: "a1", Index: 1, Kind: transcript.PartToolCall, Body: `{"id":"c1","name":"echo","input":{}}`},
				{MessageID: "a1", Index: 2, Kind: transcript.PartToolCall, Body: `{"id":"c2","name":"echo","input":{}}`},
				{MessageID: "a2", Index: 1, Kind: transcript.PartToolCall, Body: `{"id":"c3","name":"echo","input":{}}`},
			}
			for _, p := range parts {
				if err := transcript.InsertPart(ctx, tx, &p); err != nil {
					return err
				}
			}
			if err := transcript.Complete(ctx, tx, &transcript.CompleteParams{MessageID: "a1"}); err != nil {
				return err
			}
			for _, c := range []string{"c1", "c2"} {
				if err := transcript.InsertToolMessage(ctx, tx, &transcript.ToolMessageParams{ID: "r-" + c, SessionID: "s", ToolCallID: c}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	setBody := func(t *testing.T, b *testBundle, id string, idx int, body string) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `UPDATE message_parts SET body = $3 WHERE message_id = $1 AND idx = $2`, id, idx, body)
		require.NoError(t, err)
	}
	history := func(t *testing.T, b *testBundle) ([]provider.TranscriptMessage, error) {
		t.Helper()
		var h []provider.TranscriptMessage
		err := b.inTx(t, func(tx pgx.Tx) error {
			var err error
			h, err = transcript.History(ctx, tx, "s")
			return err
		})
		return h, err
	}
	check := func(t *testing.T, b *testBundle) error {
		t.Helper()
		return b.inTx(t, func(tx pgx.Tx) error {
			return transcript.CheckHistory(ctx, tx, &transcript.CheckHistoryParams{SessionID: "s"})
		})
	}
	requireUnreadable := func(t *testing.T, err error, id string, idx int) {
		t.Helper()
		var u *transcript.UnreadablePartError
		require.True(t, errors.As(err, &u), "an unreadable part, not %v", err)
		require.Equal(t, id, u.MessageID)
		require.Equal(t, idx, u.Index)
		require.Error(t, u.Err, "why it does not decode")
	}

	t.Run("ReadableTranscript", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		h, err := history(t, b)
		require.NoError(t, err)
		require.Len(t, h, 4)
		require.Equal(t, []provider.ToolCall{{ID: "c1", Name: "echo", Input: []byte(`{}`)}, {ID: "c2", Name: "echo", Input: []byte(`{}`)}}, h[1].ToolCalls)
		require.NoError(t, check(t, b))
	})

	for name, body := range map[string]string{
		"NotJSON":       `{"id": "c2", "name": `,
		"NotAnObject":   `["c2", "echo"]`,
		"IDNotAString":  `{"id": 2, "name": "echo", "input": {}}`,
		"ASecondObject": `{"id":"c2","name":"echo","input":{}} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			seed(t, b)
			setBody(t, b, "a1", 2, body)
			_, err := history(t, b)
			requireUnreadable(t, err, "a1", 2)
			requireUnreadable(t, check(t, b), "a1", 2)
		})
	}

	t.Run("CheckNamesTheFirstInTranscriptOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		setBody(t, b, "a1", 2, "x")
		setBody(t, b, "a1", 1, "y")
		requireUnreadable(t, check(t, b), "a1", 1)
	})

	t.Run("OnlyWhatTheProviderSeesIsJudged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		setBody(t, b, "a2", 1, "not json")
		setBody(t, b, "a1", 0, "not json, but text")
		_, err := history(t, b)
		require.NoError(t, err, "a pending step is not part of the history")
		require.NoError(t, check(t, b), "so it fails no check either")
	})

	t.Run("QueuedReadHandsItToTheCaller", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		setBody(t, b, "a1", 2, "not json")
		var (
			got        []provider.TranscriptMessage
			unreadable error
			sets       int
			after      int
		)
		batch := &pgx.Batch{}
		transcript.QueueHistory(batch, "s", func(h []provider.TranscriptMessage, u error) {
			got, unreadable = h, u
			sets++
		})
		batch.Queue(`SELECT 7`).QueryRow(func(row pgx.Row) error { return row.Scan(&after) })
		require.NoError(t, b.pool.SendBatch(ctx, batch).Close(), "an unreadable transcript fails no statement of the batch")
		require.Equal(t, 1, sets)
		require.Empty(t, got)
		requireUnreadable(t, unreadable, "a1", 2)
		require.Equal(t, 7, after, "the statements after it were read")

		setBody(t, b, "a1", 2, `{"id":"c2","name":"echo","input":{}}`)
		batch = &pgx.Batch{}
		transcript.QueueHistory(batch, "s", func(h []provider.TranscriptMessage, u error) { got, unreadable = h, u })
		require.NoError(t, b.pool.SendBatch(ctx, batch).Close())
		require.NoError(t, unreadable)
		require.Len(t, got, 4)
	})
}
