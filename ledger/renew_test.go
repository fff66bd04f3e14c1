package ledger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// An execution's writes renew its lease (the fence opens each): while
// they come more often than lease/3, KeepAlive has nothing to renew and
// sends nothing; once they stop, its renewals keep the claim.
func TestKeepAliveRenewsOnlyWhenNoWriteDid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	var renewals atomic.Int32
	lease := 600 * time.Millisecond
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease: lease, OwnerID: "owner-a", OnRenewedFunc: func() { renewals.Add(1) },
	})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })

	// Six of lease/3 with a write every quarter of it.
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(lease / 12) {
		require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }))
	}
	require.Zero(t, renewals.Load(), "renewals sent while writes renewed the lease")

	require.Eventually(t, func() bool { return renewals.Load() >= 3 }, 10*time.Second, 10*time.Millisecond,
		"the writes stopped, the renewals go on")
	require.False(t, x.Fenced())
	require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }), "the claim is live, three leases later")
}

// A renewal that falls due while the pool has no free connection does not
// hold the execution's writes back while it waits for one: the write that
// comes meanwhile goes first, and renews the lease itself, so the renewal
// is not sent. Holding the execution's lock while it waited, a renewal
// made a turn's answer wait for its connection and then for its own
// round trip (docs/benchmarks.md).
func TestRenewalWaitingForAConnectionHoldsNoWriteBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, url := testkit.Pool(t)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var renewals atomic.Int32
	lease := 3 * time.Second
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease: lease, OwnerID: "owner-a", OnRenewedFunc: func() { renewals.Add(1) },
	})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")

	held, err := pool.Acquire(ctx) // the pool's only connection
	require.NoError(t, err)
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })
	time.Sleep(lease/3 + lease/6) // the renewal fell due and waits for the connection

	wrote := make(chan error, 1)
	go func() { wrote <- x.Write(ctx, func(pgx.Tx) error { return nil }) }()
	require.Eventually(t, x.Busy, 10*time.Second, time.Millisecond, "the write is under way")
	held.Release()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the write never ran")
	}
	require.Zero(t, renewals.Load(), "a renewal went before the write that came while it waited")
	require.False(t, x.Fenced())
}

// KeepAlive's first renewal falls due lease/3 after the claim was sent,
// however late KeepAlive starts: a claim found only after its commit's
// answer was lost may have spent most of its lease being looked for.
// Counted from KeepAlive's start, the first renewal came after the lease
// had run out.
func TestKeepAliveStartedLateRenewsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	lease := 1500 * time.Millisecond
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "owner-a"})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1") // its last write, sent now, renewed the lease
	time.Sleep(lease * 11 / 15)  // 1.1 s of 1.5 s
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })
	time.Sleep(lease * 6 / 15) // past the end of the lease the claim had
	require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }), "the claim was renewed in time")
}

// A renewal that fell due while a write held the execution's lock looks
// again a tenth of lease/3 later, not lease/3 later: the write may fail,
// and renew nothing.
func TestRenewalBehindAFailedWriteComesSoonAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	renewed := make(chan time.Time, 16)
	lease := 3 * time.Second // renewals due every second; a busy one looks again after 100 ms
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease: lease, OwnerID: "owner-a", OnRenewedFunc: func() { renewed <- time.Now() },
	})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })

	// A write from before the renewal falls due until well after it,
	// which then fails: the lease is not renewed by it.
	time.Sleep(lease / 3 * 8 / 10)
	failed := errors.New("the write's own failure")
	err := x.Write(ctx, func(pgx.Tx) error {
		time.Sleep(lease / 3 * 6 / 10)
		return failed
	})
	require.ErrorIs(t, err, failed)
	ended := time.Now()
	select {
	case at := <-renewed:
		require.Less(t, at.Sub(ended), lease/3/2, "the renewal came, but only at the next beat")
	case <-time.After(lease / 3 * 2):
		require.FailNow(t, "no renewal after the failed write")
	}
}
