package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// A published row whose published_at is not a time ('-infinity',
// 'infinity': the column admits both; a hand edit, a restore or a repair
// script may leave one) is pruned with the old rows: its time says nothing
// of when it was published, so no retention can be counted from it, and
// the outbox is no archive. Before, 'infinity' was never older than the
// cutoff: the row was kept for good, and since the pass stops at the
// first batch holding a row to keep, every pass stopped there and no
// published row behind it was ever pruned again.
func TestPrunerPrunesAPublicationTimeThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			pool, _ := testkit.Pool(t)
			fill(t, pool, "odd", 1, 2*time.Hour)
			_, err := pool.Exec(ctx, `UPDATE outbox SET published_at = $1::timestamptz WHERE key = 'odd'`, value)
			require.NoError(t, err)
			fill(t, pool, "old", 25, 2*time.Hour)
			fill(t, pool, "recent", 5, time.Minute)

			p := mustPruner(t, pool, &PrunerConfig{Retention: time.Hour, BatchSize: 10})
			n, err := p.Prune(ctx)
			require.NoError(t, err)
			require.Equal(t, 26, n)
			require.Zero(t, countKey(t, pool, "odd"))
			require.Zero(t, countKey(t, pool, "old"), "the rows behind it are pruned")
			require.Equal(t, 5, countKey(t, pool, "recent"), "rows within the retention stay")
		})
	}
}
