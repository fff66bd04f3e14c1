package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// What a continued turn reads of the ledger: the key of the attempt it
// sends again, and the calls left requested.
func TestContinuedReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AttemptKeyReadsTheKeyOfThatAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.attemptRow(t, "s", "e1", "a1", ledger.AttemptRetryWait, nil)
		b.attemptRow(t, "s", "e1", "a2", ledger.AttemptRetryWait, nil)
		b.exec(t, `UPDATE attempts SET idempotency_key = 'key-' || attempt_id`)
		var key string
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			key, err = ledger.AttemptKey(ctx, tx, &ledger.AttemptKeyParams{AttemptID: "a2"})
			return err
		})
		require.Equal(t, "key-a2", key)

		err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := ledger.AttemptKey(ctx, tx, &ledger.AttemptKeyParams{AttemptID: "nothing"})
			return err
		})
		require.ErrorContains(t, err, "reading attempt nothing", "an attempt that does not exist is an error")
	})

	t.Run("RequestedCallsReadsTheSessionsRequestedCallsInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		b.session(t, "other", 0)
		b.attemptRow(t, "s", "e1", "a1", ledger.AttemptSucceeded, nil)
		b.attemptRow(t, "s", "e1", "a2", ledger.AttemptSucceeded, nil)
		b.attemptRow(t, "other", "e2", "a3", ledger.AttemptSucceeded, nil)
		now := time.Now()
		b.callRow(t, "s", "a2", "later", 0, "idempotent", ledger.CallRequested, now.Add(time.Second))
		b.callRow(t, "s", "a1", "second", 1, "side_effecting", ledger.CallRequested, now)
		b.callRow(t, "s", "a1", "first", 0, "idempotent", ledger.CallRequested, now)
		b.callRow(t, "s", "a1", "started", 2, "idempotent", ledger.CallStarted, now)
		b.callRow(t, "other", "a3", "elsewhere", 0, "idempotent", ledger.CallRequested, now)
		b.exec(t, `UPDATE tool_calls SET input = jsonb_build_object('call', call_id)`)

		var calls []ledger.CallParams
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			calls, err = ledger.RequestedCalls(ctx, tx, &ledger.RequestedCallsParams{SessionID: "s"})
			return err
		})
		want := func(id, attempt string, idx int, class string) ledger.CallParams {
			return ledger.CallParams{ID: id, AttemptID: attempt, Index: idx, ModelCallID: "m-" + id, Tool: "echo", Class: class, IdempotencyKey: "k-" + id}
		}
		inputs := make([]string, len(calls))
		for i := range calls {
			inputs[i], calls[i].Input = string(calls[i].Input), nil
		}
		require.Equal(t, []ledger.CallParams{
			want("first", "a1", 0, "idempotent"),
			want("second", "a1", 1, "side_effecting"),
			want("later", "a2", 0, "idempotent"),
		}, calls, "requested calls of the session only, by request time, attempt and index")
		for i, id := range []string{"first", "second", "later"} {
			require.JSONEq(t, `{"call": "`+id+`"}`, inputs[i], "each call keeps its own input")
		}

		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			calls, err = ledger.RequestedCalls(ctx, tx, &ledger.RequestedCallsParams{SessionID: "nobody"})
			return err
		})
		require.Empty(t, calls)
	})
}
