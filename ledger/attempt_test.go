package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

func TestDeterministicIDs(t *testing.T) {
	t.Parallel()

	require.Equal(t, "recovery-continue-e1", ledger.ContinuationID("e1"))
	require.Equal(t, "e1/step-3", ledger.AttemptID("e1", 3))
}

// The ledger's own statements on attempts and tool calls, each with the
// phase it commits beside it: the phase is recovery's evidence (P4).
func TestAttemptsAndCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// acquired returns an execution of session s with one provider attempt
	// begun.
	acquired := func(t *testing.T) (*testBundle, *ledger.Execution, ledger.AttemptParams) {
		t.Helper()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		p := ledger.AttemptParams{
			ID: ledger.AttemptID("e1", 1), AssistantMessageID: "a1", Step: 1, Provider: "scripted",
			IdempotencyKey: "k1", RequestHash: []byte{1},
		}
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.BeginAttempt(ctx, tx, p) }))
		return b, x, p
	}
	phase := func(t *testing.T, b *testBundle) ledger.Claim {
		t.Helper()
		c, ok, err := ledger.Get(ctx, b.pool, "s")
		require.NoError(t, err)
		require.True(t, ok)
		return c
	}
	attempt := func(t *testing.T, b *testBundle, id string) (state string, tries int) {
		t.Helper()
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state, tries FROM attempts WHERE attempt_id = $1`, id).Scan(&state, &tries))
		return state, tries
	}

	t.Run("BeginCommitsIntentWithPhaseUnknown", func(t *testing.T) {
		t.Parallel()
		b, _, p := acquired(t)
		c := phase(t, b)
		require.Equal(t, ledger.PhaseUnknown, c.Phase)
		require.Equal(t, "a1", c.AssistantMessageID)
		state, tries := attempt(t, b, p.ID)
		require.Equal(t, string(ledger.AttemptStarted), state)
		require.Equal(t, 1, tries)
	})

	t.Run("BeginTwiceIsRefusedUnlessDeferred", func(t *testing.T) {
		t.Parallel()
		b, x, p := acquired(t)
		err := x.Write(ctx, func(tx pgx.Tx) error { return x.BeginAttempt(ctx, tx, p) })
		require.ErrorContains(t, err, "not awaiting a retry", "an attempt ID is never reused for a second request")

		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			return x.DeferAttempt(ctx, tx, p.ID, 10*time.Second, "rate limited")
		}))
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "a deferred attempt was certainly not acted on")
		state, _ := attempt(t, b, p.ID)
		require.Equal(t, string(ledger.AttemptRetryWait), state)
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			tries, wait, err := ledger.AttemptRetry(ctx, tx, p.ID)
			require.Equal(t, 1, tries)
			require.Greater(t, wait, 8*time.Second)
			require.LessOrEqual(t, wait, 10*time.Second)
			return err
		}))

		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.BeginAttempt(ctx, tx, p) }))
		state, tries := attempt(t, b, p.ID)
		require.Equal(t, string(ledger.AttemptStarted), state)
		require.Equal(t, 2, tries, "a retry counts a try")
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase)
	})

	// The same rules through the call a later step's intent is written by
	// (promptline_step_begin), which also creates the step's assistant
	// message.
	t.Run("StepBeginTwiceIsRefusedUnlessDeferred", func(t *testing.T) {
		t.Parallel()
		b, x, _ := acquired(t)
		p := ledger.AttemptParams{ID: ledger.AttemptID("e1", 2), AssistantMessageID: "a2", Step: 2, Provider: "scripted",
			IdempotencyKey: "k2", RequestHash: []byte{2}, Model: "m", RequestTokens: 11}
		begin := func() error {
			return x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseUnknown, p.AssistantMessageID,
				ledger.StepBeginCall([]string{"u1"}, "turn-1", p), nil)
		}
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.SetPhase(ctx, tx, ledger.PhaseContinue, "") }))
		require.NoError(t, begin())
		c := phase(t, b)
		require.Equal(t, []any{ledger.PhaseUnknown, "a2"}, []any{c.Phase, c.AssistantMessageID})
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'started' AND step = 2
			AND execution_id = 'e1' AND fencing_token = 1 AND assistant_message_id = 'a2' AND idempotency_key = 'k2'
			AND request_hash = '\x02' AND model = 'm' AND request_tokens = 11 AND tries = 1`, p.ID))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = 'a2' AND role = 'assistant'
			AND status = 'pending' AND answers = '{u1}' AND turn_id = 'turn-1' AND execution_id = 'e1' AND fencing_token = 1`))

		require.ErrorContains(t, begin(), "not awaiting a retry", "an attempt ID is never reused for a second request")
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			return x.DeferAttempt(ctx, tx, p.ID, time.Second, "rate limited")
		}))
		require.NoError(t, begin(), "the deferred attempt begun again, its message kept")
		state, tries := attempt(t, b, p.ID)
		require.Equal(t, []any{string(ledger.AttemptStarted), 2}, []any{state, tries}, "a retry counts a try")
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = 'a2'`))
	})

	t.Run("FinishRecordsOutcomeAndUsage", func(t *testing.T) {
		t.Parallel()
		b, x, p := acquired(t)
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			return ledger.FinishAttempt(ctx, tx, p.ID, ledger.AttemptFailed, "boom", 7, 9)
		}))
		var state, errText string
		var in, out int64
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state, error, input_tokens, output_tokens FROM attempts WHERE attempt_id = $1`, p.ID).
			Scan(&state, &errText, &in, &out))
		require.Equal(t, []any{string(ledger.AttemptFailed), "boom", int64(7), int64(9)}, []any{state, errText, in, out})

		err := x.Write(ctx, func(tx pgx.Tx) error {
			return ledger.FinishAttempt(ctx, tx, p.ID, "nonsense", "", 0, 0)
		})
		require.ErrorContains(t, err, "recording outcome of attempt "+p.ID)
	})

	// The tool path's three calls (migration 00022), as the executor sends
	// them through WriteCallRetried: the response with its calls, each
	// call's intent, each call's result.
	t.Run("CallsStartAndSettleWithPhases", func(t *testing.T) {
		t.Parallel()
		b, x, p := acquired(t)
		_, err := b.pool.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, execution_id, fencing_token)
			VALUES ('a1', 's', 'assistant', 'pending', 'e1', 1)`)
		require.NoError(t, err)
		calls := []ledger.CallParams{
			{ID: "c1", AttemptID: p.ID, Index: 0, ModelCallID: "m1", Tool: "echo", Class: "idempotent", Input: []byte(`{"text":"hi"}`), IdempotencyKey: "k-c1"},
			{ID: "c2", AttemptID: p.ID, Index: 1, ModelCallID: "m2", Tool: "append_line", Class: "side_effecting", Input: []byte(`{not json`), IdempotencyKey: "k-c2"},
			{ID: "c4", AttemptID: p.ID, Index: 2, ModelCallID: "m4", Tool: "append_line", Class: "side_effecting", Input: []byte(`{}`), IdempotencyKey: "k-c4"},
		}
		events := func(topic string) ledger.Events {
			return ledger.Events{Topics: []string{topic}, Keys: []string{"s"}, Payloads: [][]byte{[]byte(`{}`)}}
		}
		requested := func(calls []ledger.CallParams) error {
			parts := make([]string, len(calls))
			for i, c := range calls {
				parts[i] = `{"id":"` + c.ModelCallID + `"}`
			}
			return x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseContinue, "a1",
				ledger.StepCallsCall(p.ID, 3, 4, "resp-1", "a1", "some text", parts, calls, events("step")), nil)
		}
		start := func(id string) error {
			return x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseUnknown, "", ledger.CallStartCall(id, events("start "+id)), nil)
		}
		settle := func(id string, state ledger.CallState, output string) (open, started int32, err error) {
			err = x.WriteCallRetried(ctx, ledger.RetryOpts{}, "", "",
				ledger.CallSettleCall(id, p.ID, state, output, output == "", "model-"+id, events("settle "+id)),
				func(row pgx.Row) (err error) {
					open, started, err = ledger.ScanCallCounts(row)
					return err
				})
			return open, started, err
		}

		require.NoError(t, requested(calls))
		var in1, in2, key2 string
		var idx2 int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT input::text FROM tool_calls WHERE call_id = 'c1'),
			(SELECT input #>> '{}' FROM tool_calls WHERE call_id = 'c2'), (SELECT idempotency_key FROM tool_calls WHERE call_id = 'c2'),
			(SELECT idx FROM tool_calls WHERE call_id = 'c2')`).Scan(&in1, &in2, &key2, &idx2))
		require.JSONEq(t, `{"text":"hi"}`, in1)
		require.Equal(t, `{not json`, in2, "invalid input is kept as a JSON string")
		require.Equal(t, []any{"k-c2", 1}, []any{key2, idx2})
		require.Equal(t, 3, b.count(t, `SELECT count(*) FROM tool_calls WHERE attempt_id = $1 AND state = 'requested'
			AND session_id = 's' AND execution_id = 'e1' AND fencing_token = 1`, p.ID))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = $1 AND state = 'succeeded'
			AND input_tokens = 3 AND output_tokens = 4 AND response_id = 'resp-1'`, p.ID))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = 'a1' AND status = 'completed'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts WHERE message_id = 'a1' AND idx = 0 AND kind = 'text' AND body = 'some text'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM message_parts WHERE message_id = 'a1' AND idx = 3 AND kind = 'tool_call' AND body::jsonb = '{"id":"m4"}'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'step'`))
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "the calls must run, then the model see them")
		// Again, with no text and no parts, so that only the calls can
		// conflict.
		err = x.WriteCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseContinue, "a1",
			ledger.StepCallsCall(p.ID, 3, 4, "resp-1", "a1", "", nil, calls[:1], events("step")), nil)
		require.ErrorContains(t, err, "tool_calls_pkey", "a step's calls are recorded once")
		require.ErrorContains(t, err, "promptline_step_calls: ", "the error names the write's function")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "and keeps the server's error")
		require.Equal(t, "23505", pgErr.Code)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'step'`), "and nothing of the second write stays")

		require.NoError(t, start("c1"))
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase, "a started call may be running")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'start c1'`))
		err = start("c1")
		require.ErrorContains(t, err, "not in state requested", "a call is started once")
		require.ErrorContains(t, err, "promptline_call_start: ", "the error names the write's function")
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "PLCNR", pgErr.Code)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'start c1'`), "the refused start wrote nothing")

		open, started, err := settle("c1", ledger.CallSucceeded, "hi")
		require.NoError(t, err)
		require.Equal(t, []int32{2, 0}, []int32{open, started}, "c2 and c4 are still requested")
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "nothing is in flight: c2 never started")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages m JOIN message_parts p USING (message_id)
			WHERE m.message_id = 'c1' AND m.role = 'tool' AND m.tool_call_id = 'model-c1' AND NOT m.is_error AND m.status = 'completed'
			AND m.execution_id = 'e1' AND m.fencing_token = 1 AND p.idx = 0 AND p.kind = 'text' AND p.body = 'hi'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = 'c1' AND state = 'succeeded' AND output = 'hi' AND NOT is_error`))

		// Another call started (the executor runs one at a time; the
		// ledger does not rely on it): its outcome is not recorded yet.
		require.NoError(t, start("c2"))
		require.NoError(t, start("c4"))
		open, started, err = settle("c2", ledger.CallInterrupted, "")
		require.NoError(t, err)
		require.Equal(t, []int32{1, 1}, []int32{open, started}, "c4 is still started")
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase, "c4 may be running")

		open, started, err = settle("c4", ledger.CallSucceeded, "ok")
		require.NoError(t, err)
		require.Equal(t, []int32{0, 0}, []int32{open, started}, "the last")
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "the model must see the results")
		require.Equal(t, 0, b.count(t, ledger.OpenCallsSQL, p.ID))

		_, _, err = settle("c2", ledger.CallSucceeded, "again")
		require.Error(t, err, "a settled call is not settled again: its tool message is there")
		var state string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state FROM tool_calls WHERE call_id = 'c2'`).Scan(&state))
		require.Equal(t, string(ledger.CallInterrupted), state)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'settle c2'`), "the refused settle wrote nothing")
	})
}
