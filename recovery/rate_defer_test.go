package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// A pass whose next token comes only after its interval leaves the claim
// for the next pass at once: it does not try the bucket again and again
// until the interval ends (maxTokenWait, the wait computed for a short
// take). At 1e-6 tokens a second the next token is days away; the pass's
// budget is a minute, and the pass takes a few statements.
func TestRecoveryRateDefersAtOnceWhenTheTokenIsPastThePass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.expiredReady(t, "slow", 1)
	b.fillBucket(t, 0)
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "rec", Batch: 10, RedriveAfter: time.Hour,
		Rate: 1e-6, Interval: time.Minute})
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	p, err := rec.RunOnce(tctx)
	require.NoError(t, err, "the pass ended before its interval")
	require.Equal(t, 1, p.Deferred)
	require.Less(t, time.Since(start), 20*time.Second, "deferred at once, not after trying until the interval's end")
}
