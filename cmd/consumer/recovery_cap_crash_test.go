package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/recovery"
)

// TestRecoveryCapStopsACrashLoop: a turn whose provider step kills its
// process each time it is sent (the scripted /crash, faults build), to a
// provider that honours idempotency keys, so that recovery sends the step
// again each time (idempotent_provider_retry) rather than reconciling it.
// With --recovery-max-per-session 2, the first crash and the two
// continuations' crashes kill three consumers; the third recovery finds
// the session's turn run again twice within the hour and quarantines the
// claim with reason recovery_cap instead: the fourth consumer is not
// killed, serves other sessions, and the capped session is left alone.
//
// It catches: a loop without end (the fourth consumer killed too, the
// claim never quarantined), a cap counted in memory (each restarted
// process starts at zero: the loop never ends), and a cap that takes
// effect one recovery too late or too early.
func TestRecoveryCapStopsACrashLoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-rec-cap"
	flags := append([]string{"--provider-honours-idempotency-keys",
		"--recovery-max-per-session", "2", "--recovery-max-per-session-window", "1h"}, recoveryFlags...)
	p := prompt(session, "/crash")

	first := b.start(t, "consumer-1", "", flags...)
	b.send(t, p)
	requireKilled(t, first.waitExit(t, crashTimeout))
	for i := 2; i <= 3; i++ {
		// Recovery continues the turn, whose step kills this one too.
		c := b.start(t, fmt.Sprintf("consumer-%d", i), "", flags...)
		requireKilled(t, c.waitExit(t, crashTimeout))
		require.Equal(t, i-1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'continued'
			AND rule = 'idempotent_provider_retry'`, session), "each crash recovered once, by sending the step again")
	}

	last := b.startConsumer(t, "consumer-4", flags...)
	deadline := time.Now().Add(crashTimeout)
	for {
		require.True(t, last.running(), "the turn killed a fourth consumer: recovery was not capped")
		if b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND quarantine_reason LIKE 'recovery_cap:%'`, session) == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the claim was not quarantined with reason recovery_cap within %s", crashTimeout)
		select {
		case <-last.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
	var reason string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT quarantine_reason FROM claims WHERE session_id = $1`, session).Scan(&reason))
	require.True(t, strings.HasPrefix(reason, recovery.ReasonRecoveryCap+": "), reason)
	require.Contains(t, reason, "2 times within 1h0m0s (cap 2)")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1 AND decision = 'quarantined'
		AND quarantine_reason LIKE 'recovery_cap:%'`, session))
	// The counter moves after the decision's commit, the gauge at the end
	// of the pass that decided: both a moment after the row shows it.
	// (Scraped here, not in Eventually's goroutine: a failed scrape fails
	// the test.)
	metricsBy := time.Now().Add(10 * time.Second)
	for last.metric(t, "promptline_recovery_capped_total") != 1.0 ||
		last.metric(t, "promptline_quarantined_rows", `kind="claim"`) != 1.0 {
		require.True(t, time.Now().Before(metricsBy), "capped_total %v, quarantined_rows %v",
			last.metric(t, "promptline_recovery_capped_total"), last.metric(t, "promptline_quarantined_rows", `kind="claim"`))
		select {
		case <-last.exited:
			t.Fatal("the consumer exited")
		case <-time.After(20 * time.Millisecond):
		}
	}

	// The consumer lives on and serves other sessions.
	other := prompt("s-rec-cap-other", "still here")
	b.send(t, other)
	turn := b.events.waitTurn(t, other.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type, "%+v", turn)
	require.True(t, last.running(), "not killed again")
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM recoveries WHERE session_id = $1`, session), "no recovery after the cap")
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session), "the step was sent three times, not a fourth")
}
