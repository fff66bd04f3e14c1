package outbox

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// A pass held BatchSize rows whatever their size: rows near the message
// limit (a large answer's events, a backlog after an outage of Kafka) made
// every relay of the fleet hold hundreds of megabytes at once (300 rows of
// 896 kB: 954 MB of heap in use above the start, measured). A pass ends at
// MaxPassBytes; the loop and Flush go on at once, in ID order, and publish
// every row.
func TestRelayPassIsBoundedInBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const rows, size = 60, 896 << 10
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox (topic, key, payload)
SELECT $1, 's' || (i % 7), convert_to(lpad(i::text, 6, '0') || repeat(md5(i::text), $2 / 32), 'UTF8')
FROM generate_series(1, $3) i ORDER BY i`, testTopic, size, rows)
	require.NoError(t, err)

	var mu sync.Mutex
	var passes []int
	r := NewRelay(b.pool, b.producer, &RelayConfig{Logger: testkit.Logger(t, nil), OnPublished: func(n int, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		passes = append(passes, n)
	}})
	runtime.GC()
	start := time.Now()
	require.NoError(t, r.Flush(ctx))
	t.Logf("%d rows of %d kB published in %s, in passes of %v rows", rows, size>>10, time.Since(start), passes)

	require.Zero(t, testkit.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`), "Flush published every row")
	limit := maxPassBytesDefault/(size+6) + 1
	for _, n := range passes {
		require.LessOrEqual(t, n, limit, "a pass holds MaxPassBytes, and the row that reached it")
	}

	// In ID order per key, each once (a pass ended early leaves its later
	// rows to the next, never a hole).
	got := testkit.ReadAll(t, b.broker.Addr(), testTopic)
	require.Len(t, got, rows)
	last := map[string]string{}
	for _, m := range got {
		k, v := string(m.Key), string(m.Value[:6])
		require.Less(t, last[k], v, "key %s in ID order", k)
		last[k] = v
	}
}
