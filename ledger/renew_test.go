package ledger_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	lease := 1200 * time.Millisecond
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease: lease, OwnerID: "owner-a", OnRenewedFunc: func() { renewals.Add(1) },
	})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })

	// Six of lease/3 with a write every quarter of it (a write and its
	// pause may take three quarters more on a loaded machine).
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(lease / 12) {
		require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }))
	}
	require.Zero(t, renewals.Load(), "renewals sent while writes renewed the lease")

	require.Eventually(t, func() bool { return renewals.Load() >= 3 }, 10*time.Second, 10*time.Millisecond,
		"the writes stopped, the renewals go on")
	require.False(t, x.Fenced())
	require.NoError(t, x.Write(ctx, func(pgx.Tx) error { return nil }), "the claim is live, three leases later")
}

// oneConnection is a claim of session s, by execution e1, on a pool of
// one connection, which it holds; KeepAlive runs (stopped at the end).
// prepare, if not nil, runs on the claim first. It returns once a due
// renewal is about to wait for the connection; release gives it back.
func oneConnection(t *testing.T, cfg ledger.ClaimsConfig, prepare func(b *testBundle, x *ledger.Execution)) (b *testBundle, x *ledger.Execution, release func()) {
	t.Helper()
	ctx := context.Background()
	_, url := testkit.Pool(t)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg.OwnerID = "owner-a"
	b = &testBundle{pool: pool, claims: ledger.NewClaims(pool, &cfg)}
	due := make(chan struct{})
	var once sync.Once
	b.claims.SetBeforeRenewalAcquire(func() { once.Do(func() { close(due) }) })
	b.session(t, "s", 0)
	x = b.acquire(t, "s", "e1")
	if prepare != nil {
		prepare(b, x)
	}
	held, err := pool.Acquire(ctx) // the pool's only connection
	require.NoError(t, err)
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })
	select {
	case <-due:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no renewal fell due")
	}
	return b, x, held.Release
}

// A renewal that falls due while the pool has no free connection waits
// for one holding nothing of the execution: its writes go on meanwhile.
// Holding the execution's lock while it waited, a renewal made a turn's
// answer wait for its connection and then for its own round trips
// (docs/benchmarks.md).
func TestRenewalWaitingForAConnectionHoldsNoWriteBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, x, release := oneConnection(t, ledger.ClaimsConfig{Lease: 3 * time.Second}, nil)
	require.Never(t, x.Busy, 100*time.Millisecond, 5*time.Millisecond,
		"the renewal waiting for a connection holds the execution's lock")
	wrote := make(chan error, 1)
	go func() { wrote <- x.Write(ctx, func(pgx.Tx) error { return nil }) }()
	require.Eventually(t, x.Busy, 10*time.Second, time.Millisecond, "the write is under way")
	release()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the write never ran")
	}
	require.False(t, x.Fenced())
}

// A write that fails transiently is retried while the lease lives, holding
// the execution's lock (retry.go); renewals go on beside it, so that the
// lease, and the retries with it, outlive the database's trouble. Behind
// the lock, a renewal that fell due first (waiting for the pool's only
// connection) let the retries run the lease out, and the write failed.
func TestRenewalsGoOnBesideAWritesRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lease := 3 * time.Second
	var acquired time.Time
	_, x, release := oneConnection(t, ledger.ClaimsConfig{Lease: lease}, func(*testBundle, *ledger.Execution) { acquired = time.Now() })

	healed := acquired.Add(lease + 600*time.Millisecond) // the trouble outlasts the lease the claim had
	wrote := make(chan error, 1)
	go func() {
		wrote <- x.WriteRetried(ctx, ledger.RetryOpts{}, func(pgx.Tx) error {
			if time.Now().Before(healed) {
				return &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "serialization failure (injected)"}
			}
			return nil
		})
	}()
	require.Eventually(t, x.Busy, 10*time.Second, time.Millisecond, "the write is under way")
	release()
	select {
	case err := <-wrote:
		require.NoError(t, err, "the lease was renewed beside the retries")
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the write never ended")
	}
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

// A renewal that falls due while a write holds the execution's lock is
// not put off to the next beat: the write may fail, and renew nothing.
// (It goes beside the write, waiting only for the claim's row.)
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

// A renewal that meets the claim released by the execution's own last
// write is no fence: the release is told from a lost claim, and nothing
// is reported (the fenced-writes metric would count a healthy turn).
func TestRenewalBesideTheReleaseIsNoFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	var fenced atomic.Int32
	lease := 900 * time.Millisecond
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{
		Lease: lease, OwnerID: "owner-a", OnFencedFunc: func() { fenced.Add(1) },
	})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })
	released, err := x.Finish(ctx, func(pgx.Tx) error {
		// The claim's row is locked by this write's fence: the renewal
		// that falls due meanwhile waits for it.
		require.Eventually(t, func() bool { return b.lockWaiters(t) == 1 }, 10*time.Second, 5*time.Millisecond,
			"a renewal waits on the claim's row")
		return nil
	})
	require.NoError(t, err)
	require.True(t, released)
	require.Eventually(t, func() bool { return b.lockWaiters(t) == 0 }, 10*time.Second, 5*time.Millisecond, "the renewal ended")
	stop()
	require.Zero(t, fenced.Load(), "the release was reported as a lost claim")
}

// A renewal that finds its claim lost gives its connection back before it
// waits for the execution's lock to mark it fenced: a write of the
// execution may hold that lock while it waits for a connection. Holding
// both, the renewal and the write waited for each other until the write's
// round-trip bound, and the write failed with a deadline, not the fence.
func TestFencedRenewalWaitsForTheLockWithoutAConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lease := time.Second
	_, x, release := oneConnection(t, ledger.ClaimsConfig{Lease: lease, RoundTripTimeout: 6 * time.Second},
		func(b *testBundle, x *ledger.Execution) {
			b.exec(t, `UPDATE claims SET fencing_token = fencing_token + 1`) // taken over
			ledger.SetLeaseFrom(x, time.Now().Add(-lease))                   // a renewal is due at once
		})
	wrote := make(chan error, 1)
	began := time.Now()
	go func() { wrote <- x.Write(ctx, func(pgx.Tx) error { return nil }) }()
	require.Eventually(t, x.Busy, 10*time.Second, time.Millisecond, "the write is under way")
	release()
	select {
	case err := <-wrote:
		require.ErrorIs(t, err, ledger.ErrFenced)
		require.Less(t, time.Since(began), 3*time.Second, "the write waited for the renewal")
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the write never ended")
	}
	require.True(t, x.Fenced())
}

// A write's retries end within one lease of their start, though the
// renewals beside them keep the lease alive: a "transient" error that
// never heals (a statement always past its timeout) must leave the claim
// to expire for recovery, not wedge the session for as long as the
// renewals succeed.
func TestRetriesEndWithinALeaseThoughRenewalsGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	lease := 600 * time.Millisecond
	b := &testBundle{pool: pool, claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: lease, OwnerID: "owner-a"})}
	b.session(t, "s", 0)
	x := b.acquire(t, "s", "e1")
	kctx, cancel := context.WithCancel(ctx)
	stop := x.KeepAlive(kctx)
	t.Cleanup(func() { cancel(); stop() })
	wctx, wcancel := context.WithTimeout(ctx, 10*lease)
	defer wcancel()
	began := time.Now()
	err := x.WriteRetried(wctx, ledger.RetryOpts{}, func(pgx.Tx) error {
		return &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "canceling statement due to statement timeout (injected)"}
	})
	require.ErrorContains(t, err, "the lease ends before another retry")
	require.NoError(t, wctx.Err(), "the retries ended on their own")
	require.Less(t, time.Since(began), 2*lease)
}
