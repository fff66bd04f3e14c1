package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// Crash window "stale-write", the other way round: the combined
// transaction [a, z] whose connection is cut has already passed a's fence
// and written a's answer (a Call, promptline_turn_answer, at its
// position), and waits in z's part, for z's session row. a's retry waits
// behind it for a's session row; once z's row is free the lost
// transaction commits, and the retry must find a's write applied (PLAPP)
// and take it as landed: the answer once, the claim kept for the input
// that waits, and the execution live, its next write applied (a retry
// that took PLAPP for a lost claim, or a position left behind, would
// wedge the session).
func TestStaleWriteBeforeItsRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newStaleWriteRig(t)
	r.b.session(t, "a", 1) // an input waits: the answer keeps the claim
	r.b.session(t, "z", 1)
	xa := r.b.acquire(t, "a", "e-a")
	xz := r.b.acquire(t, "z", "e-z")
	lockZ := r.lock("z")
	blocked := r.busyFlushes()

	type result struct {
		released bool
		err      error
	}
	aDone, zDone := make(chan result, 1), make(chan error, 1)
	go func() {
		// No landed check: the position alone must keep the answer from
		// being written twice (a landed check would find it and hide a
		// fence that let the retry through).
		released, err := xa.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, "", answerCall("none", "none"))
		aDone <- result{released, err}
	}()
	go func() {
		_, err := xz.FinishQueued(ctx, "", "", func(batch *pgx.Batch) {
			queueRow(batch, outbox.Row{Topic: "t", Key: "z", Payload: []byte("z1")})
		})
		zDone <- err
	}()
	require.Eventually(t, func() bool { return ledger.GroupCommitQueued(r.b.claims) == 2 }, 20*time.Second, 5*time.Millisecond,
		"a and z wait together for a flush")
	r.freeFlushes(blocked)
	// Past a's part (its answer written, its position applied), waiting
	// for z's row.
	var lost []int
	require.Eventually(t, func() bool { lost = r.waiters("%promptline_finish_open%"); return len(lost) == 1 },
		20*time.Second, 5*time.Millisecond, "the combined transaction waits for z's row")

	r.cutWithItsCancel()
	require.Error(t, <-zDone, "z's write is in doubt, and not retried")
	// a's retry waits for a's session row, which the lost transaction holds.
	require.Eventually(t, func() bool { return len(r.waiters("%")) == 2 }, 20*time.Second, 5*time.Millisecond,
		"a's retry waits behind the lost transaction")
	select {
	case res := <-aDone:
		t.Fatalf("a's retry ended while the lost transaction held a's row: %+v", res)
	default:
	}
	require.NoError(t, lockZ.Commit(ctx))

	res := <-aDone
	require.NoError(t, res.err, "the retry found its write applied: landed")
	require.False(t, res.released, "an input waits: the claim is kept")
	require.False(t, xa.Fenced(), "the execution lives on")
	require.Equal(t, 1, r.b.count(t, `SELECT count(*) FROM outbox WHERE key = 'k' AND payload = 'answer'`), "the answer once")
	require.Equal(t, 1, r.b.count(t, `SELECT count(*) FROM outbox WHERE key = 'z' AND payload = 'z1'`),
		"the lost transaction committed whole, z's part with it")
	require.NoError(t, xa.WriteQueued(ctx, ledger.PhaseUnknown, "", func(batch *pgx.Batch) {
		queueRow(batch, outbox.Row{Topic: "t", Key: "a", Payload: []byte("a2")})
	}), "a's next write passes its fence")
	var phase string
	require.NoError(t, r.b.pool.QueryRow(ctx, `SELECT phase FROM claims WHERE session_id = 'a'`).Scan(&phase))
	require.Equal(t, string(ledger.PhaseUnknown), phase)
}
