package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// Outbox rows the relay quarantined are listed, counted and released like
// the others; a released row goes back to the relay.
func TestOutboxQuarantine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `INSERT INTO outbox (topic, key, payload, quarantine_reason, quarantined_at)
		VALUES ('session-events', 's', 'x', 'message of about 2000064 bytes exceeds the producer''s limit of 1000000', now())`)
	var id string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id::text FROM outbox`).Scan(&id))

	counts, err := recovery.QuarantinedCounts(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, map[string]int{recovery.KindClaim: 0, recovery.KindInput: 0, recovery.KindOutbox: 1}, counts)
	rows, err := recovery.ListQuarantined(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, recovery.QuarantinedRow{Kind: recovery.KindOutbox, ID: id, SessionID: "s", Reason: rows[0].Reason, QuarantinedAt: rows[0].QuarantinedAt}, rows[0])
	require.Contains(t, rows[0].Reason, "exceeds the producer's limit")

	require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindOutbox, id, &recovery.ReleaseOpts{Operator: "op", Note: "payload shortened"}))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE quarantine_reason IS NULL AND published_at IS NULL`),
		"released: the relay publishes it on its next pass")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE kind = 'outbox' AND ref = $1`, id))
}

// Releasing a quarantined input serialises with admission and recovery on
// the session row (docs/design.md, invariant 7) and wakes the session in the same
// transaction when nothing else will: no claim holds the session. Before
// the fix the release neither locked the session nor wrote a wake, so the
// input ran only when the redrive found it (here: never, its interval is an
// hour).
func TestReleasedInputIsWoken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	quarantine := func(b *testBundle, msg string) {
		b.exec(t, `UPDATE inputs SET quarantine_reason = 'looked wrong', quarantined_at = now() WHERE message_id = $1`, msg)
		b.exec(t, `DELETE FROM outbox WHERE topic = 'wakes'`)
	}

	t.Run("NoClaimTheReleaseWakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		quarantine(b, "m1")
		require.Zero(t, b.pass(t).Redriven, "the redrive is out of the picture")

		release := b.holdSession(t, "s") // an admission in flight
		done := make(chan error, 1)
		go func() {
			done <- recovery.Release(ctx, b.pool, recovery.KindInput, "m1", &recovery.ReleaseOpts{Operator: "op", Note: "checked"})
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the release waits for the session row")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = 'm1' AND quarantine_reason IS NOT NULL`))
		release()
		require.NoError(t, <-done)

		require.Equal(t, 1, b.wakes(t, "s"), "the release wrote the session's wake")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE kind = 'input' AND ref = 'm1'`))
		rec := &recorder{}
		b.run(t, rec, nil, "s")
		require.Len(t, rec.all(), 1, "the released prompt ran")
		require.Equal(t, "m1", rec.all()[0].Turn[0].ID)
	})

	t.Run("LiveClaimNoWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m0", "running")
		b.admit(t, "s", "m1", "hello")
		b.acquire(t, "s", "exec-s")
		quarantine(b, "m1")
		require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindInput, "m1", &recovery.ReleaseOpts{Operator: "op"}))
		require.Zero(t, b.wakes(t, "s"), "the claim's holder sees the input when it releases (invariant 7)")
	})

	// The release reads the input's session, locks it, then releases the
	// input; an input that changed sessions in between would have its wake
	// and its lock on the wrong session, so the release refuses and rolls
	// back. No path of the product moves an input; the test moves it while
	// the release waits for the session's lock.
	t.Run("InputThatMovedMeanwhileIsNotReleased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.admit(t, "other", "m2", "hi")
		quarantine(b, "m1")
		release := b.holdSession(t, "s")
		done := make(chan error, 1)
		go func() {
			done <- recovery.Release(ctx, b.pool, recovery.KindInput, "m1", &recovery.ReleaseOpts{Operator: "op"})
		}()
		require.Eventually(t, func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%FROM sessions%FOR UPDATE%'`) == 1
		}, 10*time.Second, 5*time.Millisecond, "the release waits for the session row")
		b.exec(t, `UPDATE inputs SET session_id = 'other' WHERE message_id = 'm1'`)
		release()
		require.ErrorContains(t, <-done, "it moved from session s to other meanwhile")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = 'm1' AND quarantine_reason IS NOT NULL`),
			"the release rolled back")
		require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases`))
		require.Zero(t, b.wakes(t, "s")+b.wakes(t, "other"))
	})

	t.Run("NotWaitingNoWake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.admit(t, "s", "m1", "hello")
		b.exec(t, `UPDATE inputs SET wake_pending = false WHERE message_id = 'm1'`) // resume: false
		quarantine(b, "m1")
		require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindInput, "m1", &recovery.ReleaseOpts{Operator: "op"}))
		require.Zero(t, b.wakes(t, "s"), "an input admitted without a wake stays without one (invariant 3)")
	})
}

// A quarantined claim whose reason still holds is not released: the
// release says why, clears nothing and audits nothing, instead of letting
// the next pass quarantine it again (a loop an operator cannot see).
// Before the fix the release lifted the quarantine of a claim that still
// pointed at a missing assistant message.
func TestReleaseOfAStillInvalidClaimSaysWhy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.admit(t, "s", "m1", "hello")
	b.acquire(t, "s", "exec-s")
	b.exec(t, `UPDATE claims SET phase = 'ready', assistant_message_id = 'gone'`)
	b.die(t, "s")
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionQuarantined])

	err := recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op", Note: "tried"})
	require.ErrorIs(t, err, recovery.ErrStillInvalid)
	require.ErrorContains(t, err, "claim points at missing assistant message gone")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE quarantine_reason = 'claim points at missing assistant message gone'`),
		"the quarantine stays")
	require.Zero(t, b.count(t, `SELECT count(*) FROM quarantine_releases`), "nothing was released")

	// Repaired (nothing was promoted: the claim names no message), the
	// release goes through and the next pass decides.
	b.exec(t, `UPDATE claims SET assistant_message_id = NULL`)
	wakes := b.wakes(t, "s")
	require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op", Note: "dropped the dangling message id"}))
	require.Equal(t, 1, b.pass(t).Decisions[recovery.DecisionRewoken])
	require.Equal(t, wakes+1, b.wakes(t, "s"), "the decision wakes the waiting input")
}
