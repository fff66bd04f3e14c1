package executor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// A turn read every waiting input of its session (the view, and the
// claim's check of it under the lock): at 100,000 prompts waiting a turn
// cost a second, and the queue drained in quadratic time. What a turn
// reads of inputs (rows of the table and of its indexes, counted by the
// server) must not grow with the queue behind the head: the same layout
// of the head (the oldest prompt, 150 steers, a continuation) behind 100
// and behind 20,000 queued prompts reads as much. Measured before the
// table has statistics, with them, and with generic plans (the plan must
// not rest on what the planner knows).
func TestATurnReadsTheHeadOfADeepQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`ALTER TABLE inputs SET (autovacuum_enabled = false)`)
	// fill admits n queued prompts, then 150 steers and a continuation.
	fill := func(s string, n int) {
		exec(`INSERT INTO sessions (session_id) VALUES ($1)`, s)
		exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT $1 || '-q' || lpad(g::text, 6, '0'), $1, 'prompt', '\x00', 'queue', true FROM generate_series(1, $2::int) g`, s, n)
		exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT $1 || '-s' || lpad(g::text, 6, '0'), $1, 'steer', '\x00', 'steer', true FROM generate_series(1, 150) g`, s)
		exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1 || '-c', $1, '', '\x00', 'queue', true, 'continuation')`, s)
	}
	// read is what the statements of one turn read of inputs: the view
	// (waitingSQL), and the claim's check of it under the lock
	// (promptline_claim_as_read, given what the view read), in a
	// transaction rolled back.
	read := func(t *testing.T, s string, generic bool) (rows int64, head []waitingInput) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if generic {
			_, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
			require.NoError(t, err)
		}
		counted := func() int64 {
			var n int64
			require.NoError(t, tx.QueryRow(ctx, `
				SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c
				WHERE c.oid = 'inputs'::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'inputs'::regclass)`).Scan(&n))
			return n
		}
		before := counted()
		r, err := tx.Query(ctx, waitingSQL, s, maxSteersPerTurn, maxSteerBytesPerTurn)
		require.NoError(t, err)
		head, err = scanWaiting(r)
		require.NoError(t, err)
		ids := make([]string, len(head))
		for i, w := range head {
			ids[i] = w.id
		}
		_, err = tx.Exec(ctx, `SELECT promptline_claim_as_read($1, 'e', 'o', 1, 60000, 'unknown', '', $2)`, s, ids)
		require.NoError(t, err, "the claim's check agrees with the read")
		return counted() - before, head
	}
	fill("shallow", 100)
	fill("deep", 20_000)
	for _, stats := range []string{"WithoutStatistics", "WithStatistics", "GenericPlans"} {
		if stats == "WithStatistics" {
			exec(`ANALYZE inputs`)
		}
		generic := stats == "GenericPlans"
		shallow, sh := read(t, "shallow", generic)
		deep, dh := read(t, "deep", generic)
		t.Logf("%s: inputs rows read by a turn: %d behind 100 queued prompts, %d behind 20,000; %d in the head", stats, shallow, deep, len(dh))
		require.LessOrEqual(t, deep, shallow+10, "%s: a turn reads the head, not the queue", stats)
		require.Less(t, deep, int64(1000), "%s: a turn reads the head, not the queue", stats)
		require.Equal(t, 1+100+1, len(dh), "the head: the oldest, 100 steers, the continuation")
		require.Equal(t, "deep-q000001", dh[0].id)
		require.Equal(t, "deep-c", dh[len(dh)-1].id)
		require.Equal(t, len(dh), len(sh))
	}
}
