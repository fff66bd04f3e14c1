package main

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
)

// TestCrashDuringProviderAttemptLeavesSpendAtRisk: a consumer is SIGKILLed
// while a provider attempt is in flight, after the provider's first bytes
// carried its response ID. The second consumer's recovery reconciles the
// attempt as unknown (never replayed); the ledger kept the model, the
// request's token estimate and the response ID; `session show` and
// `recovery explain` show them; the second consumer's /metrics counts the
// unknown attempt and its tokens at risk; and PromptlineProviderSpendAtRisk
// fires in a real Prometheus scraping it.
//
// It catches: a response ID written only with the outcome (a crash loses
// it), an estimate or model not written with the intent, a recovery that
// does not count what it reconciles, a gauge the recovery loop does not
// feed, and an alert whose expression does not match the exported series.
func TestCrashDuringProviderAttemptLeavesSpendAtRisk(t *testing.T) {
	testkit.SkipInShortTier(t, "prometheus")
	t.Parallel()
	promBin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "prometheus is not on PATH: apt-get install prometheus")
	b := setup(t)
	const session = "s-spend-at-risk"
	// The scripted provider reports the ID at once, as a real provider's
	// headers would, then the step hangs: the kill comes mid-request.
	p := prompt(session, "/response-id req-kill-1\n/sleep 60s\nhello")

	crashing := b.start(t, "consumer-1", "", "--lease", "1s")
	b.send(t, p)
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'started'
			AND response_id = 'req-kill-1' AND model = 'scripted' AND request_tokens > 0`, session) == 1
	}, 30*time.Second, 10*time.Millisecond, "the attempt in flight, with what is known of it")
	require.NoError(t, crashing.cmd.Process.Signal(syscall.SIGKILL))
	requireKilled(t, crashing.waitExit(t, crashTimeout))
	tokens := b.count(t, `SELECT request_tokens FROM attempts WHERE session_id = $1`, session)

	c := b.start(t, "consumer-2", "", recoveryFlags...)
	metricsAddr := c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
	failed := b.events.waitTurn(t, p.MessageID)
	require.Equal(t, envelope.EventTurnFailed, failed.Type, "%+v", failed)
	require.Equal(t, envelope.FailOutcomeUnknown, failed.Reason)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1`, session), "never replayed")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = $1 AND state = 'unknown'
		AND response_id = 'req-kill-1' AND model = 'scripted' AND request_tokens = $2`, session, tokens))

	// The metrics of the process whose recovery reconciled it.
	base := "http://" + metricsAddr
	const labels = `{model="scripted",provider="scripted"}`
	require.Eventually(t, func() bool {
		_, body := httpGet(t, base+"/metrics")
		unknown, ok1 := metricValue(body, "promptline_provider_attempts_unknown_total"+labels)
		atRisk, ok2 := metricValue(body, "promptline_provider_tokens_at_risk"+labels)
		return ok1 && ok2 && unknown == 1 && atRisk == float64(tokens)
	}, 30*time.Second, 100*time.Millisecond, "one unknown attempt and its %d tokens at risk", tokens)

	db := []string{"--database-url", b.dbURL}
	out, stderr, code := runOnce(t, append([]string{"session", "show", session}, db...)...)
	require.Zero(t, code, stderr)
	require.Regexp(t, fmt.Sprintf(`(?m)^  \S+/step-1\s+1\s+scripted\s+scripted\s+unknown\s.*\s%d/-/-\s+req-kill-1\s`, tokens), out)
	out, stderr, code = runOnce(t, append([]string{"recovery", "explain", session}, db...)...)
	require.Zero(t, code, stderr)
	require.Contains(t, out, fmt.Sprintf("model scripted, about %d input tokens, provider response ID req-kill-1.", tokens))

	prom := startPrometheus(t, promBin, metricsAddr, "PromptlineProviderSpendAtRisk")
	require.Eventually(t, func() bool {
		return prom.alertState(t, "PromptlineProviderSpendAtRisk") == "firing"
	}, 30*time.Second, 100*time.Millisecond, "PromptlineProviderSpendAtRisk should fire")
	for _, a := range prom.alerts(t) {
		if a.Labels["alertname"] == "PromptlineProviderSpendAtRisk" {
			require.Equal(t, "scripted", a.Labels["provider"])
			require.Equal(t, "scripted", a.Labels["model"])
			require.Contains(t, a.Annotations["runbook_url"], "docs/runbook.md#promptlineproviderspendatrisk")
		}
	}
}
