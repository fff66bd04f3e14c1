package recovery_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/recovery"
)

// After each pass, in auto and in hold, OnQuarantinedFunc is given the
// quarantined rows by kind as the database counts them
// (promptline_quarantined_rows).
func TestRecoveryReportsTheQuarantinedCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `INSERT INTO sessions (session_id) VALUES ('poison')`)
	b.exec(t, `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ('poison', 'poison-exec', 'dead', 1, 'bogus', now() - interval '1 hour')`)
	var reported []map[string]int
	rec := recovery.New(b.pool, &recovery.Config{OwnerID: "r", RedriveAfter: time.Hour,
		OnQuarantinedFunc: func(counts map[string]int) { reported = append(reported, counts) }})

	p, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.Decisions[recovery.DecisionQuarantined])
	want := map[string]int{recovery.KindClaim: 1, recovery.KindInput: 0, recovery.KindOutbox: 0}
	require.Equal(t, []map[string]int{want}, reported)

	require.NoError(t, recovery.SetMode(ctx, b.pool, recovery.ModeHold, "ops", "look first"))
	_, err = rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []map[string]int{want, want}, reported, "a held pass reports them too")
}
