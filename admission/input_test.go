package admission_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestInputWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		return &testBundle{pool: poolWithSessions(t, "s", "other")}
	}
	admit := func(t *testing.T, b *testBundle, p *admission.AdmitContinuationParams) admission.Holder {
		t.Helper()
		var h admission.Holder
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			h, err = admission.AdmitContinuation(ctx, tx, p)
			return err
		}))
		return h
	}
	promotionSeq := func(t *testing.T, b *testBundle, id string) int64 {
		t.Helper()
		var seq *int64
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT promotion_seq FROM inputs WHERE message_id = $1`, id).Scan(&seq))
		require.NotNil(t, seq, "%s is promoted", id)
		return *seq
	}

	t.Run("AdmitContinuationTwiceIsAnExactRetry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := &admission.AdmitContinuationParams{MessageID: "c", SessionID: "s", PayloadHash: []byte("h")}
		first := admit(t, b, p)
		require.Equal(t, admission.Holder{MessageID: "c", SessionID: "s", Kind: admission.KindContinuation, PayloadHash: []byte("h")}, first)
		require.True(t, first.Is(p))
		second := admit(t, b, p)
		require.Equal(t, first, second)
		require.True(t, second.Is(p))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs
			WHERE message_id = 'c' AND kind = 'continuation' AND delivery = 'steer' AND wake_pending AND promotion_seq IS NULL`))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM waiting_inputs WHERE message_id = 'c'`))
	})

	t.Run("AdmitContinuationOnAHeldIDReturnsTheHolder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		resume := false
		_, err := admission.NewAdmitter(b.pool, &admission.AdmitterConfig{}).Admit(ctx, []admission.Incoming{
			{Prompt: envelope.Prompt{MessageID: "c", SessionID: "other", Text: "hi", Resume: &resume}}})
		require.NoError(t, err)
		var promptHash []byte
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT payload_hash FROM inputs WHERE message_id = 'c'`).Scan(&promptHash))

		p := &admission.AdmitContinuationParams{MessageID: "c", SessionID: "s", PayloadHash: []byte("h")}
		held := admit(t, b, p)
		require.Equal(t, admission.Holder{MessageID: "c", SessionID: "other", Kind: admission.KindPrompt, PayloadHash: promptHash}, held)
		require.False(t, held.Is(p))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE message_id = 'c' AND kind = 'prompt' AND text = 'hi'`),
			"the prompt holding the ID is as it was")

		// A continuation of the same session under another payload holds
		// the ID for that payload only.
		admit(t, b, &admission.AdmitContinuationParams{MessageID: "d", SessionID: "s", PayloadHash: []byte("one")})
		p = &admission.AdmitContinuationParams{MessageID: "d", SessionID: "s", PayloadHash: []byte("two")}
		held = admit(t, b, p)
		require.Equal(t, []byte("one"), held.PayloadHash)
		require.False(t, held.Is(p))
	})

	t.Run("PromoteInputGivesIncreasingOrderOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		admit(t, b, &admission.AdmitContinuationParams{MessageID: "a", SessionID: "s", PayloadHash: []byte("a")})
		admit(t, b, &admission.AdmitContinuationParams{MessageID: "b", SessionID: "s", PayloadHash: []byte("b")})
		promote := func(id string) {
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				return admission.PromoteInput(ctx, tx, &admission.PromoteInputParams{MessageID: id})
			}))
		}
		promote("a")
		promote("b")
		a, bSeq := promotionSeq(t, b, "a"), promotionSeq(t, b, "b")
		require.Less(t, a, bSeq)
		promote("a")
		require.Equal(t, a, promotionSeq(t, b, "a"), "a promoted input keeps its order")
		require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM waiting_inputs WHERE session_id = 's'`))
		require.Equal(t, 2, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs WHERE session_id = 's' AND promoted_at IS NOT NULL`))
	})

	t.Run("QuarantineInputStopsItWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		admit(t, b, &admission.AdmitContinuationParams{MessageID: "q", SessionID: "s", PayloadHash: []byte("q")})
		admit(t, b, &admission.AdmitContinuationParams{MessageID: "k", SessionID: "s", PayloadHash: []byte("k")})
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			return admission.QuarantineInput(ctx, tx, &admission.QuarantineInputParams{MessageID: "q", Reason: "no recovery vouches for it"})
		}))
		require.Equal(t, 1, testkit.Count(t, b.pool, `SELECT count(*) FROM inputs
			WHERE message_id = 'q' AND quarantine_reason = 'no recovery vouches for it' AND quarantined_at IS NOT NULL`))
		require.Equal(t, []string{"k"}, waiting(t, b.pool, "s"), "the other input still waits")
	})

	// A released input waits again, and says so; one promoted while it was
	// quarantined does not (Waiting is read after the release).
	t.Run("ReleaseInputLiftsOnlyAQuarantinedInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, id := range []string{"q", "p", "k"} {
			admit(t, b, &admission.AdmitContinuationParams{MessageID: id, SessionID: "s", PayloadHash: []byte(id)})
		}
		release := func(id string) (admission.ReleasedInput, bool) {
			t.Helper()
			var r admission.ReleasedInput
			var found bool
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				r, found, err = admission.ReleaseInput(ctx, tx, &admission.ReleaseInputParams{MessageID: id})
				return err
			}))
			return r, found
		}
		_, found := release("q")
		require.False(t, found, "an input that is not quarantined is not found")
		_, found = release("nothing")
		require.False(t, found)
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			for _, id := range []string{"q", "p"} {
				if err := admission.QuarantineInput(ctx, tx, &admission.QuarantineInputParams{MessageID: id, Reason: "held " + id}); err != nil {
					return err
				}
			}
			return admission.PromoteInput(ctx, tx, &admission.PromoteInputParams{MessageID: "p"})
		}))
		require.Equal(t, []string{"k"}, waiting(t, b.pool, "s"))

		r, found := release("q")
		require.True(t, found)
		require.Equal(t, admission.ReleasedInput{SessionID: "s", Reason: "held q", Waiting: true}, r)
		require.Equal(t, []string{"k", "q"}, waiting(t, b.pool, "s"))
		r, found = release("p")
		require.True(t, found)
		require.Equal(t, admission.ReleasedInput{SessionID: "s", Reason: "held p", Waiting: false}, r, "promoted: it does not wait")
		_, found = release("q")
		require.False(t, found, "released once")

		var session string
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			session, found, err = admission.InputSession(ctx, tx, "k")
			return err
		}))
		require.True(t, found)
		require.Equal(t, "s", session)
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			_, found, err = admission.InputSession(ctx, tx, "nothing")
			return err
		}))
		require.False(t, found)
	})
}

// What recovery reads of inputs: whether a continuation of the session
// waits, before an operator's resolution admits one, and how many inputs
// are quarantined, for the gauge.
func TestInputReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		pool *pgxpool.Pool
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		return &testBundle{pool: poolWithSessions(t, "s", "other")}
	}
	input := func(t *testing.T, b *testBundle, id, session, kind string) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, $2, 'x', '\x00', 'steer', true, $3)`, id, session, kind)
		require.NoError(t, err)
	}
	quarantine := func(t *testing.T, b *testBundle, id string) {
		t.Helper()
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			return admission.QuarantineInput(ctx, tx, &admission.QuarantineInputParams{MessageID: id, Reason: "test"})
		}))
	}

	t.Run("WaitingContinuationIsTheLeastWaitingContinuationOrReply", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		waitingContinuation := func() string {
			t.Helper()
			var id string
			require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				id, err = admission.WaitingContinuation(ctx, tx, &admission.WaitingContinuationParams{SessionID: "s"})
				return err
			}))
			return id
		}

		require.Empty(t, waitingContinuation(), "nothing waits")
		input(t, b, "c-2", "s", admission.KindContinuation)
		input(t, b, "a-prompt", "s", admission.KindPrompt)
		input(t, b, "a-other", "other", admission.KindContinuation)
		require.Equal(t, "c-2", waitingContinuation(), "a prompt, or another session's continuation, continues no turn of the session")
		input(t, b, "b-reply", "s", admission.KindPermissionReply)
		require.Equal(t, "b-reply", waitingContinuation(), "a permission reply continues a turn too; the least ID")
		require.NoError(t, pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
			return admission.PromoteInput(ctx, tx, &admission.PromoteInputParams{MessageID: "b-reply"})
		}))
		require.Equal(t, "c-2", waitingContinuation(), "a promoted input waits no more")
		quarantine(t, b, "c-2")
		require.Empty(t, waitingContinuation(), "nor does a quarantined one")
	})

	t.Run("CountQuarantinedInputsCountsOnlyQuarantinedOnes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		count := func() int {
			t.Helper()
			n, err := admission.CountQuarantinedInputs(ctx, b.pool)
			require.NoError(t, err)
			return n
		}
		require.Zero(t, count())
		for _, id := range []string{"p", "q", "r"} {
			input(t, b, id, "s", admission.KindPrompt)
		}
		input(t, b, "elsewhere", "other", admission.KindContinuation)
		quarantine(t, b, "p")
		quarantine(t, b, "elsewhere")
		require.Equal(t, 2, count(), "every session's")
	})

	t.Run("ErrorsAreTheDrivers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for name, fn := range map[string]func(tx pgx.Tx) error{
			"WaitingContinuation": func(tx pgx.Tx) error {
				_, err := admission.WaitingContinuation(ctx, tx, &admission.WaitingContinuationParams{SessionID: "s"})
				return err
			},
			"CountQuarantinedInputs": func(tx pgx.Tx) error {
				_, err := admission.CountQuarantinedInputs(ctx, tx)
				return err
			},
		} {
			err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
				// An aborted transaction fails every later statement.
				_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
				return fn(tx)
			})
			require.ErrorContains(t, err, "current transaction is aborted", name)
		}
	})
}

func waiting(t *testing.T, pool *pgxpool.Pool, session string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT message_id FROM waiting_inputs WHERE session_id = $1 ORDER BY message_id`, session)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}
