package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// headSQL reads the head of a session's waiting inputs, in admission
// order, as the executor reads it (the IDs AcquireAsRead is given).
const headSQL = `SELECT array_agg(message_id ORDER BY admission_seq) FROM promptline_waiting_head($1)`

// peekWaiting reads session s as the executor does before AcquireAsRead:
// its claim state and token, and the head of its waiting inputs.
func peekWaiting(claims *ledger.Claims, s string) (ledger.SessionRead, []string, error) {
	var waiting []string
	r, err := claims.Peek(context.Background(), s, func(batch *pgx.Batch) {
		batch.Queue(headSQL, s).
			QueryRow(func(row pgx.Row) error { return row.Scan(&waiting) })
	})
	return r, waiting, err
}

func (b *testBundle) peek(t *testing.T, s string) (ledger.SessionRead, []string) {
	t.Helper()
	r, waiting, err := peekWaiting(b.claims, s)
	require.NoError(t, err)
	return r, waiting
}

// acquireAsRead claims s for execution e with one outbox row as its first
// write.
func (b *testBundle) acquireAsRead(t *testing.T, s, e string, r ledger.SessionRead, waiting []string) (*ledger.Execution, error) {
	t.Helper()
	return b.claims.AcquireAsRead(context.Background(), s, e, r, waiting, ledger.PhaseUnknown, e+"-answer",
		func(batch *pgx.Batch, x *ledger.Execution) {
			queueRow(batch, outbox.Row{Topic: "t", Key: s, Payload: []byte(x.Claim().ExecutionID)})
		})
}

// AcquireAsRead commits the claim with the execution's first write, and
// only while the session is as read: else nothing at all is written.
func TestAcquireAsRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TakesTheClaimWithItsFirstWrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 2)
		r, waiting := b.peek(t, "s")
		require.Equal(t, ledger.SessionRead{Exists: true}, r)
		require.Equal(t, []string{"s-in-a"}, waiting, "the head: the oldest, no steer waits")

		x, err := b.claims.AcquireAsRead(ctx, "s", "e1", r, waiting, ledger.PhaseUnknown, "answer-1",
			func(batch *pgx.Batch, x *ledger.Execution) {
				require.Equal(t, int64(1), x.Claim().Token, "the token is known before the claim commits")
				x.QueueBeginAttempt(batch, ledger.AttemptParams{ID: "e1/step-1", AssistantMessageID: "answer-1", Step: 1,
					Provider: "p", IdempotencyKey: "k", RequestHash: []byte{1}})
			})
		require.NoError(t, err)
		cl := x.Claim()
		require.Equal(t, int64(1), cl.Token)
		require.WithinDuration(t, time.Now(), cl.ExpiresAt, time.Minute, "the lease comes from the database")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND execution_id = 'e1'
			AND owner_id = 'owner-a' AND fencing_token = 1 AND phase = 'unknown' AND assistant_message_id = 'answer-1'`))
		require.Equal(t, 1, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "the session remembers the token")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'e1/step-1' AND fencing_token = 1 AND state = 'started'`),
			"the intent committed with the claim")

		// The execution writes on behind the fence, like any other.
		released, err := x.FinishQueued(ctx, ledger.PhaseSafe, "", func(*pgx.Batch) {})
		require.NoError(t, err)
		require.False(t, released, "inputs still wait")
		require.Equal(t, "safe", b.phase(t, "s"))

		_, err = b.claims.AcquireWaiting(ctx, "s", "e2", nil)
		require.ErrorIs(t, err, ledger.ErrClaimHeld, "the claim is an ordinary one")
	})

	// Each case changes the session between the read and the claim in one
	// way the read cannot see; the claim must be refused and the queued
	// write rolled back with it.
	for name, change := range map[string]func(t *testing.T, b *testBundle){
		"InputAdmitted": func(t *testing.T, b *testBundle) {
			b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
				VALUES ('steer', 's', 'x', '\x00', 'steer', true)`)
		},
		"InputQuarantined": func(t *testing.T, b *testBundle) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = 's-in-a'`)
		},
		"ClaimedAndReleasedSince": func(t *testing.T, b *testBundle) {
			x, err := b.claims.AcquireWaiting(context.Background(), "s", "other", nil)
			require.NoError(t, err)
			released, err := x.Release(context.Background(), ledger.ReleaseOpts{Stopping: true, Wake: outbox.Row{Topic: "w", Key: "s", Payload: []byte("w")}})
			require.NoError(t, err)
			require.True(t, released)
			b.exec(t, `DELETE FROM outbox`)
		},
		"ClaimedSince": func(t *testing.T, b *testBundle) {
			_, err := b.claims.AcquireWaiting(context.Background(), "s", "other", nil)
			require.NoError(t, err)
		},
	} {
		t.Run("RefusedWhen"+name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			b.session(t, "s", 2)
			r, waiting := b.peek(t, "s")
			change(t, b)
			token := b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`)

			_, err := b.acquireAsRead(t, "s", "e1", r, waiting)
			require.ErrorIs(t, err, ledger.ErrStale)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`), "no claim")
			require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`), "the first write rolled back")
			require.Equal(t, token, b.count(t, `SELECT fencing_token FROM sessions WHERE session_id = 's'`), "no token spent")
		})
	}

	t.Run("RefusedWhenClaimedAtTheRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		_, err := b.claims.AcquireWaiting(ctx, "s", "other", nil)
		require.NoError(t, err)
		r, waiting := b.peek(t, "s")
		require.Equal(t, ledger.SessionRead{Exists: true, Claimed: true, Token: 1}, r)
		_, err = b.acquireAsRead(t, "s", "e1", r, waiting)
		require.ErrorIs(t, err, ledger.ErrStale)
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))

		r, _ = b.peek(t, "missing")
		require.False(t, r.Exists)
	})

	// An admission that holds the session row while the claim waits for it
	// commits a new input: the claim, granted the lock after that commit,
	// must see the input (a check on the snapshot taken before the lock
	// would not) and refuse.
	t.Run("SeesAnInputCommittedWhileItWaitedForTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 0)
		b.session(t, "s", 1)
		r, waiting := b.peek(t, "s")

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 's' FOR UPDATE`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			VALUES ('late', 's', 'x', '\x00', 'steer', true)`)
		require.NoError(t, err)

		errc := make(chan error, 1)
		go func() {
			_, err := b.claims.AcquireAsRead(ctx, "s", "e1", r, waiting, ledger.PhaseUnknown, "", func(*pgx.Batch, *ledger.Execution) {})
			errc <- err
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%promptline_claim_as_read%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the claim waits for the session row")
		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, <-errc, ledger.ErrStale)
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
	})
}

// A claim taken as read is checked against the head of the waiting inputs
// (promptline_waiting_head, migration 00020), not the whole queue, so that
// a turn's cost does not grow with the queue. The check must still refuse
// every change that changes the turn a fresh read would choose: its
// inputs (the oldest, or the steers), the choice between steers and the
// queue, and the path (a continuation or a permission reply); and only a
// change behind the head may pass. Each case starts from a session of
// queued prompts a, b, c, reads it, changes it, and claims.
func TestAcquireAsReadChecksTheHead(t *testing.T) {
	t.Parallel()
	add := func(b *testBundle, t *testing.T, id, delivery, kind string) {
		b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, 's', 'x', '\x00', $2, true, $3)`, id, delivery, kind)
	}
	steers := func(n int) func(b *testBundle, t *testing.T) {
		return func(b *testBundle, t *testing.T) {
			for i := range n {
				add(b, t, fmt.Sprintf("s%03d", i), "steer", "prompt")
			}
		}
	}
	for _, tc := range []struct {
		name   string
		before func(b *testBundle, t *testing.T) // more of the session, before the read
		change func(b *testBundle, t *testing.T)
		stale  bool
		why    string
	}{
		{name: "Nothing", change: func(*testBundle, *testing.T) {}, why: "the same session"},
		{name: "PromptAdmittedBehind", change: func(b *testBundle, t *testing.T) { add(b, t, "d", "queue", "prompt") },
			why: "behind the head: the turn takes a either way, d waits for a later turn"},
		{name: "SteerAdmitted", change: func(b *testBundle, t *testing.T) { add(b, t, "s", "steer", "prompt") }, stale: true,
			why: "a steer jumps the queue: the turn takes it, not a"},
		{name: "SteerAdmittedBesideSteers", before: steers(2), change: func(b *testBundle, t *testing.T) { add(b, t, "s9", "steer", "prompt") },
			stale: true, why: "the turn takes every waiting steer up to the bounds: three, not two"},
		{name: "SteerAdmittedPastTheHundredth", before: steers(100), change: func(b *testBundle, t *testing.T) { add(b, t, "s9", "steer", "prompt") },
			why: "a turn takes a hundred steers at most: the same hundred"},
		{name: "SteerAdmittedPastTheHundredthBehindAContinuation", before: func(b *testBundle, t *testing.T) {
			steers(100)(b, t)
			add(b, t, "c1", "queue", "continuation")
		}, change: func(b *testBundle, t *testing.T) { add(b, t, "s9", "steer", "prompt") }, why: "the same head: the same path and steers"},
		{name: "ContinuationAdmitted", change: func(b *testBundle, t *testing.T) { add(b, t, "c1", "queue", "continuation") }, stale: true,
			why: "a continuation takes the transactional path"},
		{name: "PermissionReplyAdmitted", change: func(b *testBundle, t *testing.T) { add(b, t, "r1", "queue", "permission_reply") }, stale: true,
			why: "a reply takes the transactional path"},
		{name: "SecondContinuationAdmitted", before: func(b *testBundle, t *testing.T) { add(b, t, "c1", "queue", "continuation") },
			change: func(b *testBundle, t *testing.T) { add(b, t, "c2", "queue", "continuation") },
			why:    "the path takes the first continuation either way"},
		{name: "OldestQuarantined", change: func(b *testBundle, t *testing.T) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = 's-in-a'`)
		}, stale: true, why: "the turn would take b"},
		{name: "TailQuarantined", change: func(b *testBundle, t *testing.T) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = 's-in-c'`)
		}, why: "behind the head"},
		{name: "OlderInputReleased", before: func(b *testBundle, t *testing.T) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = 'bad' WHERE message_id = 's-in-a'`)
		}, change: func(b *testBundle, t *testing.T) {
			b.exec(t, `UPDATE inputs SET quarantine_reason = NULL WHERE message_id = 's-in-a'`)
		}, stale: true, why: "a waits again, ahead of b: the turn would take a"},
		{name: "InputCommittedAheadOfTheOldest", change: func(b *testBundle, t *testing.T) {
			// Admission numbers an input before it commits: one numbered
			// before a can commit after the read.
			b.exec(t, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, admission_seq)
				OVERRIDING SYSTEM VALUE VALUES ('early', 's', 'x', '\x00', 'queue', true, -1)`)
		}, stale: true, why: "the oldest is another: the turn would take it"},
		{name: "OldestPromoted", change: func(b *testBundle, t *testing.T) {
			b.exec(t, `UPDATE inputs SET promotion_seq = nextval('promotion_seq') WHERE message_id = 's-in-a'`)
		}, stale: true, why: "a taken: the turn would take b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 0)
			b.session(t, "s", 3)
			if tc.before != nil {
				tc.before(b, t)
			}
			r, waiting := b.peek(t, "s")
			tc.change(b, t)
			_, err := b.acquireAsRead(t, "s", "e1", r, waiting)
			if tc.stale {
				require.ErrorIs(t, err, ledger.ErrStale, tc.why)
				require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "no claim")
				return
			}
			require.NoError(t, err, tc.why)
		})
	}
}
