package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/promptline/promptline/internal/testkit"
	"github.com/stretchr/testify/require"
)

// TestQuarantineAlertEndToEnd runs the shipped alert rules in a real
// Prometheus (Debian package prometheus) scraping a real consumer: a row
// quarantined for real by the recovery stage makes
// PromptlineQuarantinedRows fire; repairing and releasing it resolves the
// alert. Then every expression of the Grafana dashboard is queried against
// that Prometheus, so the dashboard cannot rot.
//
// It catches: a gauge that recovery does not feed, an alert expression that
// does not match the exported series, a release that does not bring the
// gauge back to zero, and dashboard queries that no longer parse.
func TestQuarantineAlertEndToEnd(t *testing.T) {
	testkit.SkipInShortTier(t, "prometheus")
	t.Parallel()
	promBin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "prometheus is not on PATH: apt-get install prometheus")
	start := time.Now()

	b := setup(t)
	c := b.start(t, "consumer", "", "--recovery-interval", "300ms")
	metricsAddr := c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
	// A turn, so that the dashboard's histograms and counters have data.
	p := prompt("s-e2e-ok", "hello")
	b.send(t, p)

	prom := startPrometheus(t, promBin, metricsAddr)
	b.events.waitTurn(t, p.MessageID)

	// Quarantine a claim for real: an expired claim in a phase recovery
	// does not know, for an existing session; the next pass quarantines it.
	const bogus = "s-e2e-bogus"
	_, err = b.pool.Exec(t.Context(), `INSERT INTO sessions (session_id, fencing_token) VALUES ($1, 1)`, bogus)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		VALUES ($1, 'e-bogus', 'owner-gone', 1, 'bogus', now() - interval '1 minute')`, bogus)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return prom.alertState(t, "PromptlineQuarantinedRows") == "firing"
	}, 30*time.Second, 100*time.Millisecond, "PromptlineQuarantinedRows should fire")
	firing := prom.alerts(t)
	require.Len(t, firing, 1, "only the quarantine alert: %+v", firing)
	require.Equal(t, "claim", firing[0].Labels["kind"])
	require.Equal(t, "page", firing[0].Labels["severity"])
	require.Contains(t, firing[0].Annotations["runbook_url"], "docs/runbook.md#promptlinequarantinedrows")
	t.Logf("alert firing %s after the test started", time.Since(start).Round(time.Millisecond))

	// Repair (the runbook: the turn is complete, so phase safe), then
	// release; unrepaired, the next pass would quarantine it again.
	_, err = b.pool.Exec(t.Context(), `UPDATE claims SET phase = 'safe' WHERE session_id = $1`, bogus)
	require.NoError(t, err)
	out, stderr, code := runOnce(t, "quarantine", "release", "claim", bogus, "--operator", "test",
		"--note", "phase set to safe", "--database-url", b.dbURL)
	require.Zero(t, code, "consumer quarantine release: %s", stderr)
	require.Contains(t, out, "released claim "+bogus)

	require.Eventually(t, func() bool {
		return prom.alertState(t, "PromptlineQuarantinedRows") == ""
	}, 30*time.Second, 100*time.Millisecond, "PromptlineQuarantinedRows should resolve after the release")
	require.Zero(t, b.count(t, `SELECT count(*) FROM claims WHERE session_id = $1`, bogus), "recovery cleared the repaired claim")
	t.Logf("alert resolved %s after the test started", time.Since(start).Round(time.Millisecond))

	t.Run("DashboardQueriesRun", func(t *testing.T) {
		exprs := dashboardExprs(t)
		require.NotEmpty(t, exprs)
		withData := 0
		for _, e := range exprs {
			n := prom.query(t, e)
			if n > 0 {
				withData++
			}
		}
		// Most panels have data after one turn and one recovery; lag,
		// admissions and the quarantine gauge at least.
		t.Logf("%d of %d dashboard expressions returned series", withData, len(exprs))
		require.Greater(t, withData, len(exprs)/2)
	})
}

// dashboardExprs returns every expression of the shipped dashboard with
// Grafana's variables replaced.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../../deployments/grafana/promptline.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	var out []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, strings.NewReplacer("$__rate_interval", "1m", "$job", ".+").Replace(tg.Expr))
		}
	}
	return out
}

// promServer is a Prometheus process on loopback.
type promServer struct {
	base string
}

// startPrometheus runs Prometheus in a temporary directory with the
// shipped alerts.yml, scraping target every second and evaluating rules
// every second. The one change to the rules: the `for:` of each alert
// named in fast (PromptlineQuarantinedRows' 1m when none is named)
// becomes `for: 2s`, so that the test is bounded; everything else
// (expression, labels, annotations) is what ships.
func startPrometheus(t *testing.T, bin, target string, fast ...string) *promServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile("../../deployments/prometheus/alerts.yml")
	require.NoError(t, err)
	s := string(rules)
	if len(fast) == 0 {
		fast = []string{"PromptlineQuarantinedRows"}
	}
	for _, name := range fast {
		i := strings.Index(s, "alert: "+name+"\n")
		require.GreaterOrEqual(t, i, 0, "alerts.yml has %s", name)
		j := strings.Index(s[i:], "for: ")
		require.GreaterOrEqual(t, j, 0, "%s has a for:", name)
		k := strings.IndexByte(s[i+j:], '\n')
		require.GreaterOrEqual(t, k, 0)
		s = s[:i+j] + "for: 2s" + s[i+j+k:]
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts.yml"), []byte(s), 0o644))
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [alerts.yml]
scrape_configs:
  - job_name: promptline
    static_configs:
      - targets: [%q]
`, target)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644))

	addr := freeAddr(t)
	logs := testkit.NewSyncBuffer()
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus logs:\n%s", logs.String())
		}
	})
	p := &promServer{base: "http://" + addr}
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			require.FailNow(t, "prometheus exited", logs.String())
		default:
		}
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond, "prometheus ready")
	return p
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

func (p *promServer) api(t *testing.T, path string, into any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&env))
	require.Equal(t, "success", env.Status, "GET %s: %s: %s", path, env.ErrorType, env.Error)
	require.NoError(t, json.Unmarshal(env.Data, into))
}

// alerts returns the pending and firing alerts.
func (p *promServer) alerts(t *testing.T) []promAlert {
	t.Helper()
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	p.api(t, "/api/v1/alerts", &data)
	return data.Alerts
}

// alertState is the state of the named alert: pending, firing, or "" when
// inactive.
func (p *promServer) alertState(t *testing.T, name string) string {
	t.Helper()
	for _, a := range p.alerts(t) {
		if a.Labels["alertname"] == name {
			return a.State
		}
	}
	return ""
}

// query runs an instant query (it must succeed) and returns the number of
// series.
func (p *promServer) query(t *testing.T, expr string) int {
	t.Helper()
	var data struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	p.api(t, "/api/v1/query?query="+url.QueryEscape(expr), &data)
	return len(data.Result)
}
