// Package deployments_test checks the shipped operator files: the alert
// rules with promtool (syntax and unit tests), the Prometheus config, the
// runbook sections the alerts link to, and the Grafana dashboard's
// expressions. It runs with `make test` (go test ./...). promtool comes
// from the Debian package prometheus; without it the tests fail, never skip
// (only the fast tier, go test -short, leaves them out, saying so).
package deployments_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/promptline/promptline/internal/testkit"
)

const runbookURL = "https://github.com/promptline/promptline/blob/main/docs/runbook.md#"

func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	testkit.SkipInShortTier(t, "promtool")
	bin, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is not on PATH: apt-get install prometheus")
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out)
	return out
}

func TestAlertRules(t *testing.T) {
	t.Parallel()

	t.Run("PromtoolCheckRules", func(t *testing.T) {
		t.Parallel()
		out := promtool(t, "prometheus", "check", "rules", "alerts.yml")
		require.Contains(t, out, "SUCCESS")
	})

	t.Run("PromtoolTestRules", func(t *testing.T) {
		t.Parallel()
		out := promtool(t, "prometheus", "test", "rules", "alerts_test.yml")
		require.Contains(t, out, "SUCCESS")
	})

	t.Run("PromtoolCheckConfig", func(t *testing.T) {
		t.Parallel()
		out := promtool(t, "prometheus", "check", "config", "prometheus.yml")
		require.Contains(t, out, "alerts.yml", "prometheus.yml loads the shipped rules")
	})

	t.Run("TheIssueAlertsExist", func(t *testing.T) {
		t.Parallel()
		byName := map[string]rule{}
		for _, r := range alertRules(t) {
			byName[r.Alert] = r
		}
		for _, name := range []string{"PromptlineQuarantinedRows", "PromptlineOutboxBacklogGrowing", "PromptlineOutboxStale",
			"PromptlineConsumerLagHigh", "PromptlineFencedWrites", "PromptlineUncertainOutcomes", "PromptlineNoReadyConsumer"} {
			require.Contains(t, byName, name)
		}
		q := byName["PromptlineQuarantinedRows"]
		require.Equal(t, "1m", q.For)
		require.Equal(t, "page", q.Labels["severity"])
		require.Contains(t, q.Expr, "promptline_quarantined_rows")
	})

	t.Run("EveryAlertHasItsAnnotationsAndARunbookSection", func(t *testing.T) {
		t.Parallel()
		runbook, err := os.ReadFile("../docs/runbook.md")
		require.NoError(t, err)
		anchors := map[string]bool{}
		for l := range strings.Lines(string(runbook)) {
			if h, ok := strings.CutPrefix(strings.TrimSpace(l), "## "); ok {
				anchors[githubAnchor(h)] = true
			}
		}
		for _, r := range alertRules(t) {
			require.NotEmpty(t, r.Alert, "only alerting rules here: %+v", r)
			require.Contains(t, []string{"page", "warning"}, r.Labels["severity"], r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], r.Alert)
			require.NotEmpty(t, r.Annotations["description"], r.Alert)
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURL)
			require.True(t, ok, "%s: runbook_url %q should start with %s", r.Alert, r.Annotations["runbook_url"], runbookURL)
			require.True(t, anchors[anchor], "%s: docs/runbook.md has no section #%s", r.Alert, anchor)
			require.Equal(t, strings.ToLower(r.Alert), anchor, "the section is named after the alert")
		}
	})

	t.Run("EveryAlertIsTestedFiringAndSilent", func(t *testing.T) {
		t.Parallel()
		b, err := os.ReadFile("prometheus/alerts_test.yml")
		require.NoError(t, err)
		var f struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		require.NoError(t, yaml.Unmarshal(b, &f))
		fires, silent := map[string]bool{}, map[string]bool{}
		for _, tc := range f.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
		for _, r := range alertRules(t) {
			require.True(t, fires[r.Alert], "alerts_test.yml never expects %s to fire", r.Alert)
			require.True(t, silent[r.Alert], "alerts_test.yml never expects %s to stay silent", r.Alert)
		}
	})
}

// githubAnchor is the fragment GitHub gives a heading.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// DashboardExprs returns every PromQL expression of the dashboard with
// Grafana's variables replaced by values Prometheus accepts.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana/promptline.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	var out []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q has an empty query", p.Title)
			out = append(out, strings.NewReplacer("$__rate_interval", "1m", "$job", ".+").Replace(tg.Expr))
		}
	}
	return out
}

func TestDashboard(t *testing.T) {
	t.Parallel()

	t.Run("EveryExpressionParses", func(t *testing.T) {
		t.Parallel()
		// promtool parses the PromQL of rules offline: one recording rule
		// per expression. (cmd/consumer's end-to-end alert test also
		// queries each against a running Prometheus.)
		type rec struct {
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		}
		var rules []rec
		for i, e := range dashboardExprs(t) {
			rules = append(rules, rec{Record: "dashboard:expr" + string(rune('a'+i/26)) + string(rune('a'+i%26)), Expr: e})
		}
		b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "dashboard.yml"), b, 0o644))
		promtool(t, dir, "check", "rules", "dashboard.yml")
	})

	t.Run("CoversTheOperatorsView", func(t *testing.T) {
		t.Parallel()
		all := strings.Join(dashboardExprs(t), "\n")
		for _, m := range []string{"promptline_admissions_total", "promptline_turn_seconds_bucket", "promptline_outbox_backlog_rows",
			"promptline_kafka_consumer_lag_messages", "promptline_active_executions", "promptline_recovery_decisions_total",
			"promptline_quarantined_rows"} {
			require.Contains(t, all, m)
		}
	})
}

// TestMetricNamesAreDocumented: every promptline_ metric that an alert or
// the dashboard uses is listed in metrics/doc.go, so renaming a metric
// without updating them fails here.
func TestMetricNamesAreDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../metrics/doc.go")
	require.NoError(t, err)
	var used []string
	for _, r := range alertRules(t) {
		used = append(used, r.Expr)
	}
	used = append(used, dashboardExprs(t)...)
	listed := func(n string) bool {
		return regexp.MustCompile(`(?m)^//\s+` + regexp.QuoteMeta(n) + `[{ ]`).Match(doc)
	}
	name := regexp.MustCompile(`promptline_[a-z_]+`)
	var names []string
	for _, e := range used {
		for _, n := range name.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(n, suffix); ok && listed(base) {
					n = base // a histogram's series
				}
			}
			names = append(names, n)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	require.NotEmpty(t, names)
	for _, n := range names {
		require.True(t, listed(n), "metrics/doc.go does not list %s", n)
	}
}
