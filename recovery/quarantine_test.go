package recovery_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// Outbox rows the relay quarantined are listed, counted and released like
// the others; a released row goes back to the relay.
func TestOutboxQuarantine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `INSERT INTO outbox (topic, key, payload, quarantine_reason, quarantined_at)
		VALUES ('session-events', 's', 'x', 'message of about 2000064 bytes exceeds the producer''s limit of 1000000', now())`)
	var id string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id::text FROM outbox`).Scan(&id))

	counts, err := recovery.QuarantinedCounts(ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, map[string]int{recovery.KindClaim: 0, recovery.KindInput: 0, recovery.KindOutbox: 1}, counts)
	rows, err := recovery.ListQuarantined(ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, recovery.QuarantinedRow{Kind: recovery.KindOutbox, ID: id, SessionID: "s", Reason: rows[0].Reason, QuarantinedAt: rows[0].QuarantinedAt}, rows[0])
	require.Contains(t, rows[0].Reason, "exceeds the producer's limit")

	require.NoError(t, recovery.Release(ctx, b.pool, recovery.KindOutbox, id, "op", "payload shortened"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE quarantine_reason IS NULL AND published_at IS NULL`),
		"released: the relay publishes it on its next pass")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM quarantine_releases WHERE kind = 'outbox' AND ref = $1`, id))
}
