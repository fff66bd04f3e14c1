package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A row whose created_at is not a time ('-infinity', 'infinity': the
// column admits them, a hand edit or a restore may leave one) is published
// and marked with the rows of its batch, once, and the relay's published
// callback gets the age of the oldest row whose age is a time (0 when
// none is). Before, the
// mark computed the clock less '-infinity' and failed ("cannot subtract
// infinite timestamps") every pass: the batch was sent again on every
// pass and never marked, and no row behind it went out (P6, invariant 13).
func TestRelayMarksARowCreatedAtATimeThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var ages []time.Duration
			relay := b.newRelay(&RelayConfig{OnPublished: func(_ int, oldest time.Duration) { ages = append(ages, oldest) }})
			commit(t, b.pool, row("a", 1), row("a", 2), row("b", 1))
			_, err := b.pool.Exec(ctx, `UPDATE outbox SET created_at = $1::timestamptz WHERE id = 2`, value)
			require.NoError(t, err)
			_, err = b.pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '1 minute' WHERE id = 3`)
			require.NoError(t, err)

			require.NoError(t, relay.Flush(ctx))
			require.NoError(t, relay.Flush(ctx))
			require.Zero(t, unpublished(t, b.pool))
			got := readTopic(t, b.broker.Addr(), testTopic, 3)
			require.ElementsMatch(t, []int64{1, 2, 3}, ids(got), "each row once")
			requireKeyOrder(t, got)
			require.Len(t, ages, 1)
			require.GreaterOrEqual(t, ages[0], time.Minute)
			require.Less(t, ages[0], time.Hour)

			// A batch of such rows only: no age to report.
			commit(t, b.pool, row("c", 1))
			_, err = b.pool.Exec(ctx, `UPDATE outbox SET created_at = $1::timestamptz WHERE id = 4`, value)
			require.NoError(t, err)
			require.NoError(t, relay.Flush(ctx))
			require.Zero(t, unpublished(t, b.pool))
			readTopic(t, b.broker.Addr(), testTopic, 4)
			require.Equal(t, []time.Duration{ages[0], 0}, ages)
		})
	}
}
