package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

// The executor's functions of migration 00018, called as production calls
// them, with the fewest arguments a test needs: a later turn's first step
// (promptline_turn_next), the same after the claim (promptline_turn_first),
// and the answer with the release (promptline_turn_answer).
func nextCall(inputs []string, id string) ledger.Call {
	return ledger.Call{Func: "promptline_turn_next", Args: []any{inputs, id, id, "p", id, []byte{1}, "", int64(1),
		[]string{"t"}, []string{"k"}, [][]byte{[]byte("start")}}}
}

func firstCall(inputs []string, id string) ledger.Call {
	return ledger.Call{Func: "promptline_turn_first", Args: nextCall(inputs, id).Args}
}

func answerCall(attempt, msg string) ledger.Call {
	return ledger.Call{Func: "promptline_turn_answer", Args: []any{attempt, int64(0), int64(0), "", msg, "",
		[]string{"t"}, []string{"k"}, [][]byte{[]byte("answer")}}}
}

// A Call leaves its opening to the SQL function: these hold each function
// of production to it. The fence refuses a zombie's call before anything is
// written (invariant 5), a stale read refuses the claim with the first step
// (invariant 4), and the answer's release waits for the session's lock and
// then sees an input admitted meanwhile (invariant 7).
func TestCallsOpenAsTheirDocSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ZombieWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "z", 1)
		x := b.acquire(t, "z", "e1")
		b.expire(t, "z")
		require.ErrorIs(t, x.WriteCall(ctx, ledger.PhaseUnknown, "za", nextCall([]string{"z-in-a"}, "za")), ledger.ErrFenced)
		require.True(t, x.Fenced())
		b.session(t, "y", 0)
		y := b.acquire(t, "y", "e2")
		b.expire(t, "y")
		_, err := y.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, "", answerCall("none", "none"))
		require.ErrorIs(t, err, ledger.ErrFenced)

		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM messages`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM waiting_inputs WHERE message_id = 'z-in-a'`), "not promoted")
		require.Equal(t, 2, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'ready'`), "neither claim released nor moved")
	})

	t.Run("StaleFirstStepWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "r", 1)
		read, err := b.claims.Peek(ctx, "r", nil)
		require.NoError(t, err)
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('r2', 'r', 'x', '\x00', 'steer', true)`)
		_, err = b.claims.AcquireAsReadCall(ctx, "r", "e1", read, []string{"r-in-a"}, ledger.PhaseUnknown, "ra",
			func(*ledger.Execution) ledger.Call { return firstCall([]string{"r-in-a"}, "ra") })
		require.ErrorIs(t, err, ledger.ErrStale)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM messages`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))

		read, err = b.claims.Peek(ctx, "r", nil)
		require.NoError(t, err)
		x, err := b.claims.AcquireAsReadCall(ctx, "r", "e1", read, []string{"r-in-a", "r2"}, ledger.PhaseUnknown, "ra",
			func(*ledger.Execution) ledger.Call { return firstCall([]string{"r-in-a"}, "ra") })
		require.NoError(t, err, "read again, the claim is taken")
		require.Equal(t, int64(1), x.Claim().Token)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'unknown' AND assistant_message_id = 'ra'`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'ra' AND state = 'started'`))
	})

	t.Run("ReleaseSeesAnInputAdmittedWhileItWaitedForTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		// Admission, mid-transaction: the session's row upserted (locked),
		// an input inserted, not yet committed.
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('s') ON CONFLICT (session_id) DO UPDATE SET last_admitted_at = now()`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('late', 's', 'x', '\x00', 'queue', true)`)
		require.NoError(t, err)
		type result struct {
			released bool
			err      error
		}
		done := make(chan result, 1)
		go func() {
			released, err := x.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, "", answerCall("none", "none"))
			done <- result{released, err}
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%promptline_turn_answer%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the answer waits for the session's lock")
		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		require.False(t, r.released, "the input admitted meanwhile waits: the claim stays for it")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND phase = 'safe'`))
		require.False(t, x.Fenced())
	})
}
