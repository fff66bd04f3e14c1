package ledger_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
)

// A claim with its first write whose commit's answer was lost
// (claimUnheard): found, it is the execution's; not there, it is sent
// again; sent again behind another claim, it is stale, and not taken.
func TestClaimSentUnheard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	isClaim := func(label string) bool { return strings.Contains(label, "promptline_claim_as_read") }
	setupProxied := func(t *testing.T, log *slog.Logger) (*testBundle, *ledger.Claims, *pgproxy.Proxy) {
		t.Helper()
		pool, proxy, ppool := proxiedPools(t, nil)
		b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "direct"})}
		return b, ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "proxied", Logger: log}), proxy
	}
	claim := func(t *testing.T, b *testBundle, claims *ledger.Claims) (*ledger.Execution, error) {
		t.Helper()
		r, waiting := b.peek(t, "s")
		return claims.AcquireAsRead(ctx, "s", "e1", r, waiting, ledger.PhaseUnknown, "answer-1",
			func(batch *pgx.Batch, x *ledger.Execution) {
				x.QueueBeginAttempt(batch, ledger.AttemptParams{ID: "e1/step-1", AssistantMessageID: "answer-1", Step: 1,
					Provider: "p", IdempotencyKey: "k", RequestHash: []byte{1}})
			})
	}

	t.Run("FoundWhenCommitted", func(t *testing.T) {
		t.Parallel()
		b, claims, proxy := setupProxied(t, nil)
		b.session(t, "s", 1)
		proxy.CutAfterCommit(isClaim)
		x, err := claim(t, b, claims)
		require.NoError(t, err, "the claim committed: it is this execution's")
		require.Equal(t, 1, proxy.Stats().AmbiguousCuts)
		require.WithinDuration(t, time.Now().Add(5*time.Second), x.Claim().ExpiresAt, 3*time.Second, "its expiry read back")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'e1/step-1'`), "written once")
		require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }), "and held")
	})

	t.Run("SentAgainWhenNot", func(t *testing.T) {
		t.Parallel()
		b, claims, proxy := setupProxied(t, nil)
		b.session(t, "s", 1)
		proxy.CutBeforeCommit(isClaim)
		x, err := claim(t, b, claims)
		require.NoError(t, err)
		require.Equal(t, 1, proxy.Stats().CutsBefore)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1' AND fencing_token = 1`))
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'e1/step-1'`))
		require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }))
	})

	// The lost send commits after all, between the look for it and the
	// send again (a combined group commit that was waiting on another
	// session's lock): the second send is stale, and the claim found then
	// is this execution's. (Played here by the same claim committed on
	// another connection when the retry logs.)
	t.Run("CommittedMeanwhileIsFound", func(t *testing.T) {
		t.Parallel()
		b, claims, proxy := setupProxied(t, nil)
		b.session(t, "s", 1)
		var once sync.Once
		var first error
		claims.SetBeforeResend(func() { once.Do(func() { _, first = claim(t, b, b.claims) }) })
		proxy.CutBeforeCommit(isClaim)
		x, err := claim(t, b, claims)
		require.NoError(t, first, "the same claim committed meanwhile")
		require.NoError(t, err, "found after the stale send: this execution's")
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE attempt_id = 'e1/step-1'`), "written once")
		require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }), "and held")
	})

	// Another execution claims the session between the lost send and its
	// second one: the second is stale, the claim found is not this
	// execution's, and nothing is taken.
	t.Run("AnotherClaimMeanwhileIsNotTaken", func(t *testing.T) {
		t.Parallel()
		b, claims, proxy := setupProxied(t, nil)
		b.session(t, "s", 1)
		var once sync.Once
		var other error
		claims.SetBeforeResend(func() { once.Do(func() { _, other = b.claims.AcquireWaiting(ctx, "s", "other", nil) }) })
		proxy.CutBeforeCommit(isClaim)
		_, err := claim(t, b, claims)
		require.NoError(t, other, "the other execution claimed meanwhile")
		require.ErrorIs(t, err, ledger.ErrStale)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE session_id = 's' AND execution_id = 'other'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM attempts`), "nothing of the stale claim's write")
	})
}

// A write found landed by its retry (its commit's answer lost) renews the
// lease: the retry, refused as applied, renewed nothing, and the write
// may be an intent whose request is sent next with what is left of the
// lease after the retries.
func TestWriteFoundLandedRenewsTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, write := range map[string]func(x *ledger.Execution) error{
		// The fence function alone is a write of its own: the call of a
		// function whose arguments are the fence's.
		"Call": func(x *ledger.Execution) error {
			return x.WriteCallRetried(ctx, ledger.RetryOpts{}, "", "", ledger.Call{Func: "promptline_fence"}, nil)
		},
		// A transaction (a continuation's or a reply's promotion) that
		// writes nothing past its fence.
		"Transaction": func(x *ledger.Execution) error {
			return x.WriteRetried(ctx, ledger.RetryOpts{}, func(pgx.Tx) error { return nil })
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, proxy, ppool := proxiedPools(t, nil)
			lease := 5 * time.Second
			b := &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "owner-a"})}
			b.session(t, "s", 0)
			x := b.acquire(t, "s", "e1")
			old := time.Now().Add(-lease / 2)
			ledger.SetLeaseFrom(x, old)
			proxy.CutAfterCommit(func(label string) bool { return strings.Contains(label, "promptline_fence(") })
			began := time.Now()
			require.NoError(t, write(x))
			require.Equal(t, 1, proxy.Stats().AmbiguousCuts, "the write committed and its answer was cut")
			require.False(t, ledger.LeaseFrom(x).Before(began), "the lease was renewed after the write was found landed")
			// And renewed in the database, not only in the process's
			// reckoning: a lease the process counts from later than the
			// database does would let a request leave after the claim
			// expired. The renewal is sent at LeaseFrom and stamped by the
			// server after it (same host, same clock; 5 ms for the
			// clocks' reading); the landed write's own stamp is from
			// before the retry's backoff.
			var renewed time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT renewed_at FROM claims WHERE session_id = 's'`).Scan(&renewed))
			require.False(t, renewed.Add(5*time.Millisecond).Before(ledger.LeaseFrom(x)),
				"the database's lease (renewed at %s) starts before the process's (%s): no renewal was sent", renewed, ledger.LeaseFrom(x))
		})
	}
}
