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
