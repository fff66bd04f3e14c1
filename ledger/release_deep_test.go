package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
)

// A release (and a finishing write) keeps the claim when an input waits.
// It counted the waiting inputs to know: every turn of a session with
// 100,000 prompts waiting read all of them. It must stop at the first:
// what it reads of inputs (rows of the table and of its indexes, counted
// by the server) is the same behind 20,000 prompts as behind one.
func TestReleaseLooksAtOneWaitingInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	for _, s := range []struct {
		id string
		n  int
	}{{"one", 1}, {"deep", 20_000}} {
		_, err := pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ($1)`, s.id)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
			SELECT $1 || '-' || g, $1, 'x', '\x00', 'queue', true FROM generate_series(1, $2::int) g`, s.id, s.n)
		require.NoError(t, err)
	}
	read := func(s string) int64 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		const counted = `SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c
			WHERE c.oid = 'inputs'::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'inputs'::regclass)`
		var before, after int64
		var waits bool
		require.NoError(t, tx.QueryRow(ctx, counted).Scan(&before))
		require.NoError(t, tx.QueryRow(ctx, ledger.InputWaitsSQL, s).Scan(&waits))
		require.True(t, waits)
		require.NoError(t, tx.QueryRow(ctx, counted).Scan(&after))
		return after - before
	}
	one, deep := read("one"), read("deep")
	t.Logf("inputs rows read by the release's look: %d behind one prompt, %d behind 20,000", one, deep)
	require.LessOrEqual(t, deep, one+2, "the release looks at one waiting input, not the queue")
}
