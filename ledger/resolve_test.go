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

// ReadSessionClaim reads the claim that holds a session, live, expired or
// quarantined, as a resolution reports it; no claim is not found.
func TestReadSessionClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, time.Minute)
	for _, s := range []string{"live", "expired", "quarantined", "free"} {
		b.session(t, s, 0)
	}
	b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at, quarantine_reason)
		VALUES ('live', 'e-live', 'o-live', 1, 'unknown', now() + interval '1 minute', NULL),
		       ('expired', 'e-expired', 'o', 1, 'ready', now() - interval '1 minute', NULL),
		       ('quarantined', 'e-quarantined', 'o', 1, 'ready', now() - interval '1 minute', 'bad phase')`)
	read := func(session string) (ledger.SessionClaim, bool) {
		t.Helper()
		var c ledger.SessionClaim
		var found bool
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			c, found, err = ledger.ReadSessionClaim(ctx, tx, &ledger.SessionClaimParams{SessionID: session})
			return err
		})
		return c, found
	}

	c, found := read("live")
	require.True(t, found)
	require.WithinDuration(t, time.Now().Add(time.Minute), c.ExpiresAt, 10*time.Second)
	c.ExpiresAt = time.Time{}
	require.Equal(t, ledger.SessionClaim{ExecutionID: "e-live", OwnerID: "o-live", Phase: ledger.PhaseUnknown}, c)
	c, found = read("expired")
	require.True(t, found)
	require.False(t, c.Quarantined)
	require.True(t, c.ExpiresAt.Before(time.Now()))
	c, found = read("quarantined")
	require.True(t, found)
	require.True(t, c.Quarantined)
	c, found = read("free")
	require.False(t, found, "a session without a claim")
	require.Zero(t, c)
	_, found = read("nobody")
	require.False(t, found)

	err := pgdb.InTx(ctx, b.pool, func(tx pgx.Tx) error {
		// An aborted transaction fails every later statement.
		_, _ = tx.Exec(ctx, `SELECT 1 / 0`)
		_, _, err := ledger.ReadSessionClaim(ctx, tx, &ledger.SessionClaimParams{SessionID: "live"})
		return err
	})
	require.ErrorContains(t, err, "reading the claim of live: ", "the text a resolution has always reported")
	require.ErrorContains(t, err, "current transaction is aborted")
}

// LaterUnknown compares turns as the rest of the code names them: a
// message written before migration 00003 (no turn_id) is a turn of its
// own, named by its ID, and a later step of that turn carries the ID as
// its turn_id. An unknown attempt of a later step of the target's legacy
// turn refuses the finding (its continuation would send that step
// again); one of another legacy turn is not the target's.
func TestLaterUnknownOfALegacyTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// build writes the legacy message "m" with the target's attempt, then
	// the newer assistant message "n" (turn_id nTurn, nil for a legacy
	// one) with an unknown attempt.
	build := func(t *testing.T, nTurn *string) *testBundle {
		t.Helper()
		b := setup(t, time.Minute)
		b.session(t, "s", 0)
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status) VALUES ('m', 's', 'assistant', 'errored')`)
		b.exec(t, `INSERT INTO messages (message_id, session_id, role, status, turn_id) VALUES ('n', 's', 'assistant', 'errored', $1)`, nTurn)
		for _, a := range [][3]string{{"att-m", "m", "failed"}, {"att-n", "n", "unknown"}} {
			b.exec(t, `INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
					idempotency_key, fencing_token, request_hash, state)
				VALUES ($1, 's', 'e1', $2, 1, 'p', $1, 1, '\x00', $3)`, a[0], a[1], a[2])
		}
		return b
	}
	later := func(t *testing.T, b *testBundle) (kind, id string) {
		t.Helper()
		b.inTx(t, func(tx pgx.Tx) error {
			var err error
			kind, id, err = ledger.LaterUnknown(ctx, tx, ledger.Target{Kind: ledger.TargetAttempt, ID: "att-m", SessionID: "s",
				AttemptID: "att-m", AssistantMessageID: "m"})
			return err
		})
		return kind, id
	}

	t.Run("LaterStepOfTheLegacyTurn", func(t *testing.T) {
		t.Parallel()
		kind, id := later(t, build(t, ptr("m")))
		require.Equal(t, [2]string{"attempt", "att-n"}, [2]string{kind, id}, "n is the rest of m's turn")
	})
	t.Run("AnotherLegacyTurn", func(t *testing.T) {
		t.Parallel()
		kind, id := later(t, build(t, nil))
		require.Equal(t, [2]string{"", ""}, [2]string{kind, id}, "n is a turn of its own")
	})
}
