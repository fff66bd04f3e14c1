package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit/pgproxy"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// TestReleaseReportsOnlyACommittedRelease: Release says released only
// when its commit's answer came back. A commit that failed released
// nothing: the execution still holds its claim and may write (its
// stopping release, say). A commit whose answer was lost (the ambiguous
// commit) may have released: Release cannot say it did, and the next
// write's fence finds out (invariant 5), as a retried write's does.
func TestReleaseReportsOnlyACommittedRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setupProxied := func(t *testing.T) (*testBundle, *pgproxy.Proxy) {
		t.Helper()
		pool, proxy, ppool := proxiedPools(t, nil)
		return &testBundle{pool: pool, claims: ledger.NewClaims(ppool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "owner-a"})}, proxy
	}
	isRelease := func(label string) bool { return strings.Contains(label, "DELETE FROM claims") }
	wake := outbox.Row{Topic: "wakes", Key: "s", Payload: []byte("{}")}

	for _, waiting := range []int{0, 1} {
		t.Run(fmt.Sprintf("LostCommit/Waiting=%d", waiting), func(t *testing.T) {
			t.Parallel()
			b, proxy := setupProxied(t)
			b.session(t, "s", waiting)
			x := b.acquire(t, "s", "e1")
			proxy.CutBeforeCommit(isRelease)
			released, err := x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: wake})
			require.Error(t, err)
			require.Equal(t, 1, proxy.Stats().CutsBefore)
			require.False(t, released, "nothing was released")
			require.False(t, x.Fenced(), "the claim is still held")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE execution_id = 'e1'`))
			require.Zero(t, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`))

			// The execution may still write: its stopping release.
			released, err = x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: wake})
			require.NoError(t, err)
			require.True(t, released)
			require.Zero(t, b.count(t, `SELECT count(*) FROM claims`))
			require.Equal(t, waiting, b.count(t, `SELECT count(*) FROM outbox WHERE topic = 'wakes'`))
		})
	}

	t.Run("AmbiguousCommit", func(t *testing.T) {
		t.Parallel()
		b, proxy := setupProxied(t)
		b.session(t, "s", 0)
		x := b.acquire(t, "s", "e1")
		proxy.CutAfterCommit(isRelease)
		released, err := x.Release(ctx, ledger.ReleaseOpts{})
		require.Error(t, err)
		require.Equal(t, 1, proxy.Stats().AmbiguousCuts)
		require.False(t, released, "the release is not known to have committed")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "it did")

		// The next write's fence finds the claim gone: the execution stops.
		_, err = x.Release(ctx, ledger.ReleaseOpts{Stopping: true, Wake: wake})
		require.ErrorIs(t, err, ledger.ErrFenced)
		require.True(t, x.Fenced())
		require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))
	})
}
