package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// The database gauges of /metrics read an unpublished outbox row whose
// created_at is not a time ('-infinity', 'infinity': the column admits
// them, a hand edit may leave one) without failing: the row is in the
// backlog, and the oldest unpublished age is the oldest row's whose age is
// a time. Before, the clock less '-infinity' raised "cannot subtract
// infinite timestamps" on every scrape, so the backlog, its age and the
// pending asks were gone from /metrics for as long as the row stayed.
func TestDatabaseGaugesReadTimesThatAreNotATime(t *testing.T) {
	t.Parallel()
	for _, value := range []string{"-infinity", "infinity"} {
		t.Run(value, func(t *testing.T) {
			t.Parallel()
			pool, _ := testkit.Pool(t)
			ctx := t.Context()
			_, err := pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload, created_at) VALUES ('wakes', 'odd', '\x00', $1::timestamptz)`, value)
			require.NoError(t, err)
			s, err := databaseStats(pool)(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), s.OutboxBacklog)
			require.Zero(t, s.OutboxOldestUnpublished, "no unpublished row whose age is a time")

			_, err = pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload, created_at) VALUES ('wakes', 'old', '\x00', now() - interval '1 minute')`)
			require.NoError(t, err)
			s, err = databaseStats(pool)(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), s.OutboxBacklog)
			require.GreaterOrEqual(t, s.OutboxOldestUnpublished, time.Minute)
			require.Less(t, s.OutboxOldestUnpublished, time.Hour, "the age of the row whose age is a time")
		})
	}
}
