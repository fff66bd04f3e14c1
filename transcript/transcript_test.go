package transcript_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/transcript"
)

type testBundle struct {
	pool *pgxpool.Pool
}

// setup opens a fresh database holding the session "s".
func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	b := &testBundle{pool: pool}
	_, err := pool.Exec(context.Background(), `INSERT INTO sessions (session_id) VALUES ('s')`)
	require.NoError(t, err)
	return b
}

// inTx runs fn in a transaction and commits it.
func (b *testBundle) inTx(t *testing.T, fn func(tx pgx.Tx) error) error {
	t.Helper()
	return pgdb.InTx(context.Background(), b.pool, fn)
}

// message is what a test reads of a message row.
type message struct {
	role, status, errText, turnID, toolCallID string
	answers                                   []string
	isError, completed                        bool
	token                                     int64
}

func (b *testBundle) message(t *testing.T, id string) message {
	t.Helper()
	var m message
	err := b.pool.QueryRow(context.Background(), `SELECT role, status, coalesce(error, ''), coalesce(turn_id, ''), coalesce(tool_call_id, ''),
			coalesce(answers, '{}'), is_error, completed_at IS NOT NULL, coalesce(fencing_token, 0)
		FROM messages WHERE message_id = $1`, id).
		Scan(&m.role, &m.status, &m.errText, &m.turnID, &m.toolCallID, &m.answers, &m.isError, &m.completed, &m.token)
	require.NoError(t, err, "reading message %s", id)
	return m
}

// parts returns a message's parts as kind:body, in order.
func (b *testBundle) parts(t *testing.T, id string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT kind || ':' || body FROM message_parts WHERE message_id = $1 ORDER BY idx`, id)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func assistant(id string) *transcript.InsertAssistantParams {
	return &transcript.InsertAssistantParams{
		ID: id, SessionID: "s", Answers: []string{"in-1", "in-2"}, ExecutionID: "e1", Token: 7, TurnID: "turn-" + id,
	}
}

func TestAssistant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InsertCreatesPendingAndRefusesASecond", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error { return transcript.InsertAssistant(ctx, tx, assistant("a")) }))
		m := b.message(t, "a")
		require.Equal(t, message{role: "assistant", status: "pending", turnID: "turn-a", answers: []string{"in-1", "in-2"}, token: 7}, m)

		err := b.inTx(t, func(tx pgx.Tx) error { return transcript.InsertAssistant(ctx, tx, assistant("a")) })
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v", err)
		require.Equal(t, "23505", pgErr.Code, "a second message with the ID is a unique violation")
	})

	t.Run("InsertIfAbsentLeavesAnExistingOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertAssistant(ctx, tx, assistant("a")); err != nil {
				return err
			}
			return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "a", Error: "boom"})
		}))
		again := assistant("a")
		again.Token, again.TurnID = 9, "other"
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error { return transcript.InsertAssistantIfAbsent(ctx, tx, again) }))
		m := b.message(t, "a")
		require.Equal(t, "errored", m.status, "the existing message is not reset to pending")
		require.Equal(t, int64(7), m.token)
		require.Equal(t, "turn-a", m.turnID)

		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error { return transcript.InsertAssistantIfAbsent(ctx, tx, assistant("b")) }))
		require.Equal(t, "pending", b.message(t, "b").status, "an absent message is created")
	})

	t.Run("AnswerStoresItsTextAndCompletes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			for _, a := range []struct{ id, text string }{{"a", "hello"}, {"b", ""}} {
				if err := transcript.InsertAssistant(ctx, tx, assistant(a.id)); err != nil {
					return err
				}
				if err := transcript.Answer(ctx, tx, &transcript.AnswerParams{MessageID: a.id, Text: a.text}); err != nil {
					return err
				}
			}
			return nil
		}))
		for _, id := range []string{"a", "b"} {
			m := b.message(t, id)
			require.Equal(t, "completed", m.status, id)
			require.True(t, m.completed, id)
		}
		require.Equal(t, []string{"text:hello"}, b.parts(t, "a"))
		require.Empty(t, b.parts(t, "b"), "an empty answer stores no part")
	})

	t.Run("AnswerCompletesOnlyAPendingMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertAssistant(ctx, tx, assistant("a")); err != nil {
				return err
			}
			if err := transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "a", Error: "boom"}); err != nil {
				return err
			}
			return transcript.Answer(ctx, tx, &transcript.AnswerParams{MessageID: "a", Text: ""})
		}))
		m := b.message(t, "a")
		require.Equal(t, "errored", m.status)
		require.Equal(t, "boom", m.errText)
	})

	t.Run("CompleteOnlyTouchesAPendingMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			for _, id := range []string{"a", "b"} {
				if err := transcript.InsertAssistant(ctx, tx, assistant(id)); err != nil {
					return err
				}
			}
			if err := transcript.InsertPart(ctx, tx, &transcript.PartParams{MessageID: "a", Index: 0, Kind: transcript.PartText, Body: "thinking"}); err != nil {
				return err
			}
			if err := transcript.InsertPart(ctx, tx, &transcript.PartParams{MessageID: "a", Index: 1, Kind: transcript.PartToolCall, Body: `{"id":"c"}`}); err != nil {
				return err
			}
			if err := transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "b", Error: "boom"}); err != nil {
				return err
			}
			for _, id := range []string{"a", "b"} {
				if err := transcript.Complete(ctx, tx, &transcript.CompleteParams{MessageID: id}); err != nil {
					return err
				}
			}
			return nil
		}))
		require.Equal(t, "completed", b.message(t, "a").status)
		require.Equal(t, []string{"text:thinking", `tool_call:{"id":"c"}`}, b.parts(t, "a"))
		require.Equal(t, "errored", b.message(t, "b").status, "an errored message is never completed")
	})

	t.Run("FailOnlyTouchesAPendingMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			for _, id := range []string{"pending", "completed", "errored"} {
				if err := transcript.InsertAssistant(ctx, tx, assistant(id)); err != nil {
					return err
				}
			}
			if err := transcript.Answer(ctx, tx, &transcript.AnswerParams{MessageID: "completed", Text: "done"}); err != nil {
				return err
			}
			if err := transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "errored", Error: "first"}); err != nil {
				return err
			}
			for _, id := range []string{"pending", "completed", "errored"} {
				if err := transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: id, Error: "second"}); err != nil {
					return err
				}
			}
			return nil
		}))
		p := b.message(t, "pending")
		require.Equal(t, "errored", p.status)
		require.Equal(t, "second", p.errText)
		require.True(t, p.completed, "an errored message is finished")
		c := b.message(t, "completed")
		require.Equal(t, "completed", c.status, "a completed message is never failed")
		require.Empty(t, c.errText)
		require.Equal(t, "first", b.message(t, "errored").errText, "a failed message keeps the first failure")
	})

	t.Run("InsertErroredCreatesAFinishedMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			return transcript.InsertErroredAssistant(ctx, tx, &transcript.InsertErroredAssistantParams{
				ID: "f", SessionID: "s", Answers: []string{"in-1"}, ExecutionID: "e2", Token: 8, TurnID: "turn-1", Error: "lost",
			})
		}))
		require.Equal(t, message{role: "assistant", status: "errored", errText: "lost", turnID: "turn-1", answers: []string{"in-1"}, completed: true, token: 8},
			b.message(t, "f"))
	})
}

func TestToolMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	tool := func(id string, isError bool) *transcript.ToolMessageParams {
		return &transcript.ToolMessageParams{ID: id, SessionID: "s", ToolCallID: "model-" + id, ExecutionID: "e1", Token: 7, IsError: isError}
	}

	t.Run("InsertStoresACompletedResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertToolMessage(ctx, tx, tool("c", true)); err != nil {
				return err
			}
			return transcript.InsertPart(ctx, tx, &transcript.PartParams{MessageID: "c", Index: 0, Kind: transcript.PartText, Body: "failed"})
		}))
		require.Equal(t, message{role: "tool", status: "completed", toolCallID: "model-c", answers: []string{}, isError: true, completed: true, token: 7},
			b.message(t, "c"))
		require.Equal(t, []string{"text:failed"}, b.parts(t, "c"))
	})

	t.Run("ResolvedUpsertCompletesAnExistingResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertToolMessage(ctx, tx, tool("c", true)); err != nil {
				return err
			}
			return transcript.InsertPart(ctx, tx, &transcript.PartParams{MessageID: "c", Index: 0, Kind: transcript.PartText, Body: "unknown"})
		}))
		_, err := b.pool.Exec(ctx, `UPDATE messages SET completed_at = NULL WHERE message_id = 'c'`)
		require.NoError(t, err)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.DeleteParts(ctx, tx, &transcript.DeletePartsParams{MessageID: "c"}); err != nil {
				return err
			}
			if err := transcript.UpsertResolvedToolMessage(ctx, tx, &transcript.ResolvedToolMessageParams{
				ID: "c", SessionID: "s", ToolCallID: "other", ExecutionID: "e2", Token: 9,
			}); err != nil {
				return err
			}
			return transcript.InsertTextPart(ctx, tx, &transcript.TextPartParams{MessageID: "c", Body: "it ran"})
		}))
		m := b.message(t, "c")
		require.False(t, m.isError, "a call that ran succeeded")
		require.True(t, m.completed)
		require.Equal(t, "completed", m.status)
		require.Equal(t, "model-c", m.toolCallID, "the conflict updates only the outcome")
		require.Equal(t, int64(7), m.token)
		require.Equal(t, []string{"text:it ran"}, b.parts(t, "c"))
	})

	t.Run("ResolvedUpsertCreatesAnAbsentResult", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			return transcript.UpsertResolvedToolMessage(ctx, tx, &transcript.ResolvedToolMessageParams{
				ID: "c", SessionID: "s", ToolCallID: "model-c", ExecutionID: "e2", Token: 9,
			})
		}))
		require.Equal(t, message{role: "tool", status: "completed", toolCallID: "model-c", answers: []string{}, completed: true, token: 9},
			b.message(t, "c"))
	})

	t.Run("DeleteRemovesOnlyAToolMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertToolMessage(ctx, tx, tool("c", true)); err != nil {
				return err
			}
			if err := transcript.InsertTextPart(ctx, tx, &transcript.TextPartParams{MessageID: "c", Body: "unknown"}); err != nil {
				return err
			}
			return transcript.InsertAssistant(ctx, tx, assistant("a"))
		}))
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.DeleteParts(ctx, tx, &transcript.DeletePartsParams{MessageID: "c"}); err != nil {
				return err
			}
			if err := transcript.DeleteToolMessage(ctx, tx, &transcript.DeleteToolMessageParams{MessageID: "c"}); err != nil {
				return err
			}
			return transcript.DeleteToolMessage(ctx, tx, &transcript.DeleteToolMessageParams{MessageID: "a"})
		}))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM messages WHERE message_id = 'c'`))
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM message_parts WHERE message_id = 'c'`))
		require.Equal(t, "pending", b.message(t, "a").status, "an assistant message is not a tool message")
	})
}

// What the executor reads back of a turn it continues or fails, and an
// operator's resolution of the turn it settles.
func TestTurnReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// user writes a user message with its text in parts, the way
	// promotion stores one.
	user := func(t *testing.T, b *testBundle, id string, parts ...string) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status) VALUES ($1, 's', 'user', 'completed')`, id)
		require.NoError(t, err)
		for i, body := range parts {
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				return transcript.InsertPart(ctx, tx, &transcript.PartParams{MessageID: id, Index: i, Kind: transcript.PartText, Body: body})
			}))
		}
	}

	t.Run("ReadAssistantTurnReadsAnswersTurnAndStatus", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertAssistant(ctx, tx, assistant("a")); err != nil {
				return err
			}
			return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "a", Error: "boom"})
		}))
		_, err := b.pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('old', 's', 'assistant', 'pending')`)
		require.NoError(t, err)
		read := func(id string) (transcript.AssistantTurn, error) {
			var a transcript.AssistantTurn
			err := b.inTx(t, func(tx pgx.Tx) error {
				var err error
				a, err = transcript.ReadAssistantTurn(ctx, tx, &transcript.AssistantTurnParams{MessageID: id})
				return err
			})
			return a, err
		}
		a, err := read("a")
		require.NoError(t, err)
		require.Equal(t, transcript.AssistantTurn{Answers: []string{"in-1", "in-2"}, TurnID: "turn-a", Status: "errored"}, a)
		a, err = read("old")
		require.NoError(t, err)
		require.Equal(t, transcript.AssistantTurn{Answers: []string{}, Status: "pending"}, a, "no answers, no turn ID: empty")
		_, err = read("nothing")
		require.ErrorIs(t, err, pgx.ErrNoRows, "a message that does not exist is an error")
	})

	t.Run("TurnInputsJoinsPartsInTranscriptOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		user(t, b, "u2", "hello ", "world")
		user(t, b, "u1", "first")
		user(t, b, "empty")
		user(t, b, "other", "not asked")
		var in []provider.TranscriptMessage
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			var err error
			in, err = transcript.TurnInputs(ctx, tx, &transcript.TurnInputsParams{MessageIDs: []string{"u1", "u2", "empty", "absent"}})
			return err
		}))
		require.Equal(t, []provider.TranscriptMessage{
			{ID: "u2", Role: "user", Text: "hello world"},
			{ID: "u1", Role: "user", Text: "first"},
			{ID: "empty", Role: "user"},
		}, in, "in the order they were written; an ID with no message is left out")
	})

	t.Run("CompletedStepsCountsTheTurnsOtherCompletedSteps", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		step := func(id, turn string) *transcript.InsertAssistantParams {
			p := assistant(id)
			p.TurnID = turn
			return p
		}
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			for _, p := range []*transcript.InsertAssistantParams{
				step("s1", "t"), step("s2", "t"), step("s3", "t"), step("errored", "t"), step("pending", "t"), step("elsewhere", "u"),
			} {
				if err := transcript.InsertAssistant(ctx, tx, p); err != nil {
					return err
				}
			}
			for _, id := range []string{"s1", "s2", "s3", "elsewhere"} {
				if err := transcript.Answer(ctx, tx, &transcript.AnswerParams{MessageID: id, Text: "done"}); err != nil {
					return err
				}
			}
			return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "errored", Error: "boom"})
		}))
		count := func(except string) int {
			var n int
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				var err error
				n, err = transcript.CompletedSteps(ctx, tx, &transcript.CompletedStepsParams{SessionID: "s", TurnID: "t", ExceptMessageID: except})
				return err
			}))
			return n
		}
		require.Equal(t, 3, count("new"), "completed steps of the turn only")
		require.Equal(t, 2, count("s3"), "the step about to run is not counted")
	})

	t.Run("ReadTurnIDFallsBackToTheMessagesOwnID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			return transcript.InsertAssistant(ctx, tx, assistant("a"))
		}))
		_, err := b.pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('old', 's', 'assistant', 'pending')`)
		require.NoError(t, err)
		read := func(id string) (string, error) {
			var turnID string
			err := b.inTx(t, func(tx pgx.Tx) error {
				var err error
				turnID, err = transcript.ReadTurnID(ctx, tx, &transcript.TurnIDParams{MessageID: id})
				return err
			})
			return turnID, err
		}
		turnID, err := read("a")
		require.NoError(t, err)
		require.Equal(t, "turn-a", turnID)
		turnID, err = read("old")
		require.NoError(t, err)
		require.Equal(t, "old", turnID, "a message written before turns had IDs is its own turn")
		_, err = read("nothing")
		require.ErrorIs(t, err, pgx.ErrNoRows, "a message that does not exist is an error")
	})

	t.Run("ReadNewerStepLeavesOutTheErroredRestOfTheTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('other')`)
		require.NoError(t, err)
		insert := func(id, session, turn string) {
			t.Helper()
			p := assistant(id)
			p.SessionID, p.TurnID = session, turn
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error { return transcript.InsertAssistant(ctx, tx, p) }))
		}
		newer := func(id string) (transcript.NewerStep, bool) {
			t.Helper()
			var n transcript.NewerStep
			var found bool
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				var err error
				n, found, err = transcript.ReadNewerStep(ctx, tx, &transcript.NewerStepParams{MessageID: id})
				return err
			}))
			return n, found
		}

		insert("a1", "s", "t")
		user(t, b, "later-user", "hello")
		insert("elsewhere", "other", "x")
		_, found := newer("a1")
		require.False(t, found, "user messages and other sessions' steps are not newer steps")

		insert("a2", "s", "t")
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "a2", Error: "boom"})
		}))
		_, found = newer("a1")
		require.False(t, found, "the errored rest of the step's turn supersedes nothing")

		insert("a3", "s", "t")
		n, found := newer("a1")
		require.True(t, found)
		require.Equal(t, transcript.NewerStep{MessageID: "a3", SameTurn: true}, n, "the turn went on past the step")

		insert("b1", "s", "u")
		n, found = newer("a1")
		require.True(t, found)
		require.Equal(t, transcript.NewerStep{MessageID: "b1"}, n, "the newest: a newer turn")
		_, found = newer("b1")
		require.False(t, found)
		_, found = newer("nothing")
		require.False(t, found, "no such message: nothing supersedes it")

		err = b.inTx(t, func(tx pgx.Tx) error {
			// An aborted transaction fails every later statement: an
			// error, not a step found to be the newest.
			_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
			_, _, err := transcript.ReadNewerStep(ctx, tx, &transcript.NewerStepParams{MessageID: "a1"})
			return err
		})
		require.ErrorContains(t, err, "current transaction is aborted")
	})

	// A message written before migration 00003 has no turn_id and is a
	// turn of its own, named by its ID (ReadTurnID): two such messages are
	// two turns, and the rest of one written later carries its ID.
	t.Run("LegacyTurnIsNamedByItsMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		legacy := func(id, status string) {
			t.Helper()
			_, err := b.pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status) VALUES ($1, 's', 'assistant', $2)`, id, status)
			require.NoError(t, err)
		}
		rest := func(id, turn string) {
			t.Helper()
			p := assistant(id)
			p.TurnID = turn
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				if err := transcript.InsertAssistant(ctx, tx, p); err != nil {
					return err
				}
				return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: id, Error: "boom"})
			}))
		}
		newer := func(id string) (transcript.NewerStep, bool) {
			t.Helper()
			var n transcript.NewerStep
			var found bool
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				var err error
				n, found, err = transcript.ReadNewerStep(ctx, tx, &transcript.NewerStepParams{MessageID: id})
				return err
			}))
			return n, found
		}
		steps := func(turn, except string) int {
			t.Helper()
			var n int
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				var err error
				n, err = transcript.CompletedSteps(ctx, tx, &transcript.CompletedStepsParams{SessionID: "s", TurnID: turn, ExceptMessageID: except})
				return err
			}))
			return n
		}

		legacy("l1", "completed")
		rest("l1-rest", "l1")
		_, found := newer("l1")
		require.False(t, found, "the errored rest of l1's turn supersedes nothing")
		require.Equal(t, 1, steps("l1", "next"), "l1 is a completed step of its own turn")

		legacy("l2", "errored")
		n, found := newer("l1")
		require.True(t, found)
		require.Equal(t, transcript.NewerStep{MessageID: "l2"}, n, "another legacy message is another turn, errored or not")
		_, found = newer("l1-rest")
		require.True(t, found, "l2 is newer than l1's turn")
		require.Equal(t, 0, steps("l2", "next"), "an errored message is no completed step")
	})

	t.Run("MessageStatusFindsOnlyAnExistingMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			if err := transcript.InsertAssistant(ctx, tx, assistant("a")); err != nil {
				return err
			}
			return transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: "a", Error: "boom"})
		}))
		status := func(id string) (string, bool) {
			var s string
			var found bool
			require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
				var err error
				s, found, err = transcript.MessageStatus(ctx, tx, &transcript.MessageStatusParams{MessageID: id})
				return err
			}))
			return s, found
		}
		s, found := status("a")
		require.True(t, found)
		require.Equal(t, "errored", s)
		s, found = status("nothing")
		require.False(t, found, "a step that never began has no message")
		require.Empty(t, s)
	})
}
