package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/metrics"
)

// names returns the metric names that collectors describe.
func names(t *testing.T, cs ...prometheus.Collector) []string {
	t.Helper()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	var out []string
	for _, c := range cs {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fq.FindStringSubmatch(d.String())
			require.NotNil(t, m, d.String())
			out = append(out, m[1])
		}
	}
	return out
}

// promptlineCollectors returns every collector of New (by reflection, so a
// new field cannot be forgotten) and a ScrapeCollector with all parts on.
func promptlineCollectors(t *testing.T) []prometheus.Collector {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry())
	v := reflect.ValueOf(m).Elem()
	var cs []prometheus.Collector
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		require.True(t, ok, "field %s is not a collector", v.Type().Field(i).Name)
		cs = append(cs, c)
	}
	// The operator console's, on its own registry.
	con := metrics.NewConsole(prometheus.NewRegistry())
	cs = append(cs, con.Requests, con.RequestSeconds)
	return append(cs, metrics.NewScrapeCollector(&metrics.ScrapeConfig{
		DatabaseFunc: func(context.Context) (metrics.DatabaseStats, error) { return metrics.DatabaseStats{}, nil },
		ReadyFunc:    func(context.Context) error { return nil },
	}))
}

// TestEveryMetricIsDocumented: the metric names are a public contract,
// listed in doc.go and in the README; a metric added without its line, or
// a line left behind by a rename, fails here.
func TestEveryMetricIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	registered := names(t, promptlineCollectors(t)...)
	require.NotEmpty(t, registered)
	for _, n := range registered {
		require.True(t, strings.HasPrefix(n, "promptline_"), n)
		require.Regexp(t, `(?m)^//\s+`+regexp.QuoteMeta(n)+`[{ ]`, string(doc), "doc.go does not list %s", n)
		require.Contains(t, string(readme), "`"+n, "README.md does not list %s", n)
	}
	listed := regexp.MustCompile(`(?m)^//\s+(promptline_[a-z_]+)`).FindAllStringSubmatch(string(doc), -1)
	for _, l := range listed {
		require.Contains(t, registered, l[1], "doc.go lists %s, which nothing registers", l[1])
	}
}

// gauges gathers c's gauges by name.
func gauges(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		require.Len(t, mf.GetMetric(), 1, mf.GetName())
		out[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	return out
}

func TestScrapeCollector(t *testing.T) {
	t.Parallel()

	t.Run("ReadsTheDatabaseAndReadiness", func(t *testing.T) {
		t.Parallel()
		c := metrics.NewScrapeCollector(&metrics.ScrapeConfig{
			DatabaseFunc: func(context.Context) (metrics.DatabaseStats, error) {
				return metrics.DatabaseStats{OutboxBacklog: 7, OutboxOldestUnpublished: 1500 * time.Millisecond, PermissionsPending: 2}, nil
			},
			ReadyFunc: func(context.Context) error { return nil },
		})
		require.Equal(t, map[string]float64{
			"promptline_database_stats_up": 1, "promptline_outbox_backlog_rows": 7, "promptline_outbox_oldest_unpublished_seconds": 1.5,
			"promptline_permission_requests_pending": 2, "promptline_ready": 1,
		}, gauges(t, c))
	})

	t.Run("AFailedReadLeavesTheGaugesOutAndTheScrapeWhole", func(t *testing.T) {
		t.Parallel()
		c := metrics.NewScrapeCollector(&metrics.ScrapeConfig{
			DatabaseFunc: func(ctx context.Context) (metrics.DatabaseStats, error) {
				<-ctx.Done() // a database that does not answer: the timeout ends the read
				return metrics.DatabaseStats{}, ctx.Err()
			},
			ReadyFunc: func(context.Context) error { return errors.New("Kafka: not joined") },
			Timeout:   50 * time.Millisecond,
		})
		require.Equal(t, map[string]float64{"promptline_database_stats_up": 0, "promptline_ready": 0}, gauges(t, c))
	})
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestServer(t *testing.T) {
	t.Parallel()

	t.Run("HealthzMetricsAndReadyz", func(t *testing.T) {
		t.Parallel()
		var notReady error = errors.New("Postgres: connection refused")
		ready := make(chan error, 1)
		ready <- notReady
		reg := metrics.NewRegistry()
		m := metrics.New(reg)
		m.ActiveExecutions.Set(3)
		srv, err := metrics.Listen("127.0.0.1:0", reg, &metrics.ServerConfig{ReadyFunc: func(context.Context) error {
			select {
			case err := <-ready:
				return err
			default:
				return nil
			}
		}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Close()) })
		base := "http://" + srv.Addr()

		code, body := get(t, base+"/healthz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ok\n", body)

		code, body = get(t, base+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, "not ready: Postgres: connection refused\n", body, "the reason is in the body")
		code, body = get(t, base+"/readyz")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "ready\n", body)

		code, body = get(t, base+"/metrics")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "promptline_active_executions 3")
		require.Contains(t, body, "go_goroutines")
		require.Contains(t, body, "process_")
	})

	t.Run("ReadyzIsBounded", func(t *testing.T) {
		t.Parallel()
		srv, err := metrics.Listen("127.0.0.1:0", prometheus.NewRegistry(), &metrics.ServerConfig{
			ReadyFunc: func(ctx context.Context) error {
				<-ctx.Done()
				return ctx.Err()
			},
			ReadyTimeout: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Close()) })
		code, body := get(t, "http://"+srv.Addr()+"/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "deadline exceeded")
	})

	t.Run("NilConfigIsAlwaysReady", func(t *testing.T) {
		t.Parallel()
		srv, err := metrics.Listen("127.0.0.1:0", prometheus.NewRegistry(), nil)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Close()) })
		code, _ := get(t, "http://"+srv.Addr()+"/readyz")
		require.Equal(t, http.StatusOK, code)
	})
}
