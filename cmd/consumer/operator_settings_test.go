package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/recovery"
)

// Every operator command that writes outbox rows (events, wakes) takes
// the fleet's topic settings under the consumer's names, so that one
// config file or environment serves both: without them its events and
// wakes went to the default topics, which a deployment that renamed them
// does not read (a lost wake waits for the redrive; a lost event is lost).
func TestOperatorCommandsTakeTheOutboxTopics(t *testing.T) {
	t.Parallel()
	for _, path := range [][]string{{"recover"}, {"recovery", "apply"}, {"quarantine", "release"}, {"session", "resolve"}, {"console"}} {
		out, stderr, code := runOnce(t, append(path, "--help")...)
		require.Zero(t, code, stderr)
		for _, flag := range []string{"--events-topic", "--wakes-topic"} {
			require.Contains(t, out, flag, "consumer %s", strings.Join(path, " "))
		}
	}
}

// `consumer recover` decides as the fleet and `recovery plan` do, with the
// same config file: the same policy (an idempotent provider's uncertain
// attempt is sent again, not reconciled) and the same topics.
func TestRecoverTakesTheFleetsSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const session = "s-recover-settings"
	cfg := filepath.Join(t.TempDir(), "promptline.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("events-topic: team.session-events\nwakes-topic: team.wakes\nprovider-honours-idempotency-keys: true\n"), 0o600))

	a := b.start(t, "consumer-a", faults.ProviderAfterIntent, "--lease", "1s", "--config", cfg)
	b.send(t, prompt(session, "uncertain"))
	requireKilled(t, a.waitExit(t, crashTimeout))
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1 AND expires_at <= now()`, session) == 1
	}, 10*time.Second, 20*time.Millisecond)
	var before int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&before))

	db := []string{"--database-url", b.dbURL, "--config", cfg}
	out, stderr, code := runOnce(t, append([]string{"recovery", "plan", "--json"}, db...)...)
	require.Zero(t, code, stderr)
	var plan recovery.Plan
	require.NoError(t, json.Unmarshal([]byte(out), &plan), out)
	require.Len(t, plan.Claims, 1, out)
	require.Equal(t, recovery.DecisionContinued, plan.Claims[0].Decision.Decision, out)
	require.Equal(t, recovery.RuleIdempotentProviderRetry, plan.Claims[0].Decision.Rule, out)

	out, stderr, code = runOnce(t, append([]string{"recover", "--json"}, db...)...)
	require.Zero(t, code, stderr)
	var decision, rule string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT decision, coalesce(rule, '') FROM recoveries WHERE session_id = $1`, session).Scan(&decision, &rule))
	require.Equal(t, string(recovery.DecisionContinued), decision, "recover decided otherwise than recovery plan: %s", out)
	require.Equal(t, recovery.RuleIdempotentProviderRetry, rule)

	rows, err := b.pool.Query(t.Context(), `SELECT DISTINCT topic FROM outbox WHERE id > $1 ORDER BY 1`, before)
	require.NoError(t, err)
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"team.session-events", "team.wakes"}, topics, "the recovery's event and the continuation's wake, on the fleet's topics")
}
