package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/recovery"
)

// TestCrashAfterRecoveryToken: with --recovery-rate, consumer B dies
// (SIGKILL) in its recovery pass after its paced decision took the fleet's
// last token and before the decision committed. The token went back with
// the rollback: consumer C, at a rate that refills nothing to speak of,
// still finds it and continues the turn exactly once.
//
// It catches a token taken outside the decision's transaction (lost with
// B: C would find the bucket empty and defer for good at this rate).
func TestCrashAfterRecoveryToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const session = "s-rec-token"
	sandbox := t.TempDir()
	p := prompt(session, `/tool append_line {"file":"log.txt","line":"once"}`)
	paced := append([]string{"--sandbox-dir", sandbox, "--recovery-rate", "0.001"}, recoveryFlags...)

	crashing := b.start(t, "consumer-a", stepAfterSettle, "--lease", "1s", "--sandbox-dir", sandbox)
	b.send(t, p)
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	execID, token, phase := claimOf(t, b, session)
	require.Equal(t, "continue", phase)

	// One token in the bucket, and at 0.001/s no other for a quarter of an hour.
	_, err := b.pool.Exec(ctx, `UPDATE recovery_rate SET tokens = 1, updated_at = clock_timestamp()`)
	require.NoError(t, err)

	recovering := b.start(t, "consumer-b", faults.RecoveryAfterToken, append([]string{"--group", b.group + "-b"}, paced...)...)
	requireKilled(t, recovering.waitExit(t, crashTimeout))
	gotExec, gotToken, gotPhase := claimOf(t, b, session)
	require.Equal(t, []any{execID, token, "continue"}, []any{gotExec, gotToken, gotPhase}, "the claim is as A left it")
	require.Zero(t, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session), "nothing of B's decision committed")
	var tokens float64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT tokens FROM recovery_rate`).Scan(&tokens))
	require.Equal(t, 1.0, tokens, "B's token went back with its rollback")

	b.start(t, "consumer-c", "", paced...)
	turn := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.Equal(t, []string{"once"}, sandboxLines(t, sandbox, "log.txt"), "the settled call is not run again")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE execution_id = $1 AND decision = 'continued'`, execID))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE session_id = $1 AND message_id = $2`, session, recovery.ContinuationID(execID)),
		"exactly one continuation")
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM recovery_rate WHERE tokens < 1`) == 1
	}, 10*time.Second, 20*time.Millisecond, "C spent the token")
}
