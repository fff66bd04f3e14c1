package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

	t.Run("CallsStartAndSettleWithPhases", func(t *testing.T) {
		t.Parallel()
		b, x, p := acquired(t)
		calls := []ledger.CallParams{
			{ID: "c1", AttemptID: p.ID, Index: 0, ModelCallID: "m1", Tool: "echo", Class: "idempotent", Input: []byte(`{"text":"hi"}`), IdempotencyKey: "k-c1"},
			{ID: "c2", AttemptID: p.ID, Index: 1, ModelCallID: "m2", Tool: "append_line", Class: "side_effecting", Input: []byte(`{not json`), IdempotencyKey: "k-c2"},
			{ID: "c4", AttemptID: p.ID, Index: 2, ModelCallID: "m4", Tool: "append_line", Class: "side_effecting", Input: []byte(`{}`), IdempotencyKey: "k-c4"},
		}
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.RequestCalls(ctx, tx, calls) }))
		var in1, in2 string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT input::text FROM tool_calls WHERE call_id = 'c1'), (SELECT input #>> '{}' FROM tool_calls WHERE call_id = 'c2')`).Scan(&in1, &in2))
		require.JSONEq(t, `{"text":"hi"}`, in1)
		require.Equal(t, `{not json`, in2, "invalid input is kept as a JSON string")
		err := x.Write(ctx, func(tx pgx.Tx) error { return x.RequestCalls(ctx, tx, calls[:1]) })
		require.ErrorContains(t, err, "recording tool call c1")

		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error {
			if err := ledger.FinishAttempt(ctx, tx, p.ID, ledger.AttemptSucceeded, "", 1, 1); err != nil {
				return err
			}
			return x.SetPhase(ctx, tx, ledger.PhaseContinue, "")
		}))
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.StartCall(ctx, tx, "c1") }))
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase, "a started call may be running")
		err = x.Write(ctx, func(tx pgx.Tx) error { return x.StartCall(ctx, tx, "c1") })
		require.ErrorContains(t, err, "not in state requested", "a call is started once")

		var last bool
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) (err error) {
			last, err = x.SettleCall(ctx, tx, "c1", p.ID, ledger.CallSucceeded, "hi", false)
			return err
		}))
		require.False(t, last, "c2 is still requested")
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "nothing is in flight: c2 never started")

		// Another call started (the executor runs one at a time; the
		// ledger does not rely on it): its outcome is not recorded yet.
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.StartCall(ctx, tx, "c2") }))
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) error { return x.StartCall(ctx, tx, "c4") }))
		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) (err error) {
			last, err = x.SettleCall(ctx, tx, "c2", p.ID, ledger.CallInterrupted, "", true)
			return err
		}))
		require.False(t, last, "c4 is still started")
		require.Equal(t, ledger.PhaseUnknown, phase(t, b).Phase, "c4 may be running")

		require.NoError(t, x.Write(ctx, func(tx pgx.Tx) (err error) {
			last, err = x.SettleCall(ctx, tx, "c4", p.ID, ledger.CallSucceeded, "ok", false)
			return err
		}))
		require.True(t, last)
		require.Equal(t, ledger.PhaseContinue, phase(t, b).Phase, "the model must see the results")
		require.Equal(t, 0, b.count(t, ledger.OpenCallsSQL, p.ID))

		err = x.Write(ctx, func(tx pgx.Tx) error {
			_, err := x.SettleCall(ctx, tx, "c3", p.ID, "nonsense", "", false)
			return err
		})
		require.NoError(t, err, "settling a call that is not open changes nothing")
		err = x.Write(ctx, func(tx pgx.Tx) error {
			_, err := x.SettleCall(ctx, tx, "c2", p.ID, "nonsense", "", false)
			return err
		})
		require.NoError(t, err, "a settled call is not settled again")
		var state string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT state FROM tool_calls WHERE call_id = 'c2'`).Scan(&state))
		require.Equal(t, string(ledger.CallInterrupted), state)
	})
}
