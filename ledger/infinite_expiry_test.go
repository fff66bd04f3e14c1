package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

// A claim whose expires_at is not a time ('-infinity', 'infinity': the
// column admits both, though no writer of promptline sets one) fails no read
// of claims: ExpiredClaims reads it in the pass's order ('-infinity' first,
// 'infinity' last, whatever the clock) and pages on past it, Get and
// ReadSessionClaim read it, and QuarantineClaim swaps on its value.
func TestClaimsWithAnExpiryThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	for _, s := range []string{"ninf1", "ninf2", "old", "live", "inf"} {
		b.session(t, s, 0)
	}
	b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ('ninf1', 'e-ninf1', 'o', 1, 'ready', '-infinity'),
		       ('ninf2', 'e-ninf2', 'o', 1, 'ready', '-infinity'),
		       ('old', 'e-old', 'o', 1, 'ready', now() - interval '1 minute'),
		       ('live', 'e-live', 'o', 1, 'ready', now() + interval '1 minute'),
		       ('inf', 'e-inf', 'o', 1, 'ready', 'infinity')`)

	expired := func(p *ledger.ExpiredClaimsParams) []ledger.Claim {
		t.Helper()
		cs, err := ledger.ExpiredClaims(ctx, b.pool, p)
		require.NoError(t, err, "a claim whose expiry is not a time fails no scan")
		return cs
	}
	all := expired(&ledger.ExpiredClaimsParams{Limit: 10})
	require.Equal(t, []string{"ninf1", "ninf2", "old", "inf"}, sessionsOf(all), "in the pass's order; the live claim is not read")
	require.Equal(t, ledger.ExpiryNegativeInfinity, all[0].ExpiresNotFinite)
	require.True(t, all[0].ExpiresAt.IsZero())
	require.Empty(t, all[2].ExpiresNotFinite)
	require.WithinDuration(t, time.Now().Add(-time.Minute), all[2].ExpiresAt, 10*time.Second)
	require.Equal(t, ledger.ExpiryInfinity, all[3].ExpiresNotFinite)

	// Paging one at a time from a position whose expiry is not a time.
	var paged []ledger.Claim
	p := &ledger.ExpiredClaimsParams{Limit: 1}
	for {
		page := expired(p)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		last := page[0]
		p = &ledger.ExpiredClaimsParams{Limit: 1, AfterExpiresAt: &last.ExpiresAt, AfterExpiresNotFinite: last.ExpiresNotFinite, AfterSessionID: last.SessionID}
	}
	require.Equal(t, all, paged, "paging past '-infinity' and 'infinity' skips nothing and repeats nothing")

	for _, want := range all {
		got, ok, err := ledger.Get(ctx, b.pool, want.SessionID)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want.ExpiresNotFinite, got.ExpiresNotFinite, want.SessionID)
	}
	b.inTx(t, func(tx pgx.Tx) error {
		c, found, err := ledger.ReadSessionClaim(ctx, tx, &ledger.SessionClaimParams{SessionID: "inf"})
		require.True(t, found)
		require.Equal(t, ledger.ExpiryInfinity, c.ExpiresNotFinite)
		return err
	})

	// The compare-and-swap of a quarantine holds on the value as read.
	b.inTx(t, func(tx pgx.Tx) error {
		for _, c := range []ledger.Claim{all[0], all[3]} {
			q, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: c, Reason: "not finite"})
			if err != nil {
				return err
			}
			require.True(t, q, c.SessionID)
		}
		swapped := all[1]
		swapped.ExpiresNotFinite = ledger.ExpiryInfinity
		q, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: swapped, Reason: "not finite"})
		require.False(t, q, "the claim holds '-infinity', not 'infinity': changed since it was read")
		return err
	})
	require.Equal(t, []string{"ninf2", "old"}, sessionsOf(expired(&ledger.ExpiredClaimsParams{Limit: 10})))
}

func sessionsOf(cs []ledger.Claim) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.SessionID)
	}
	return out
}

// The live holder of a claim quarantined with an expiry that is not a
// time writes nothing: quarantine takes no new token, and for a claim that
// never expires the fence's quarantine_reason IS NULL is the only term
// that stops its holder (P3, invariant 13). Without it the holder's next
// write would pass and set the claim a finite expiry, a writer on a
// session the operator believes held.
func TestQuarantinedClaimIsFencedWhateverItsExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 0)
	b.session(t, "s", 1)
	x := b.acquire(t, "s", "e1")
	b.exec(t, `UPDATE claims SET expires_at = 'infinity' WHERE session_id = 's'`)
	cs, err := ledger.ExpiredClaims(ctx, b.pool, &ledger.ExpiredClaimsParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, cs, 1)
	b.inTx(t, func(tx pgx.Tx) error {
		q, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: cs[0], Reason: "expires_at is not finite (infinity)"})
		require.True(t, q)
		return err
	})
	require.ErrorIs(t, x.Renew(ctx), ledger.ErrFenced, "the holder of a quarantined claim writes nothing")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND expires_at = 'infinity'`))
}
