package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// metricValue returns the value of the sample whose name and labels (as
// exposed, e.g. `promptline_ready` or `x_total{outcome="succeeded"}`)
// start a line of the exposition, and whether there is one.
func metricValue(exposition, series string) (float64, bool) {
	for l := range strings.Lines(exposition) {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// TestReadiness checks each condition of /readyz on a real database: the
// group joined, the migrations applied, Postgres reachable.
func TestReadiness(t *testing.T) {
	t.Parallel()
	_, dbURL := testkit.Pool(t)
	pool, err := pgxpool.New(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := newReadiness(pool)
	require.NoError(t, err)
	latest, err := latestMigration(pgdb.Migrations())
	require.NoError(t, err)
	require.GreaterOrEqual(t, latest, int64(5))
	ctx := t.Context()

	require.ErrorContains(t, r.Check(ctx), "Kafka: consumer group not joined", "before Setup")
	h := &observedHandler{ConsumerGroupHandler: nopHandler{}, ready: r}
	require.NoError(t, h.Setup(&fakeSession{ctx: ctx, generation: 3}))
	require.NoError(t, r.Check(ctx))
	require.Equal(t, int32(3), r.generation.Load())
	require.NoError(t, h.Cleanup(&fakeSession{ctx: ctx, generation: 3}))
	require.ErrorContains(t, r.Check(ctx), "Kafka", "a rebalance (Cleanup) makes it unready until the next Setup")
	require.NoError(t, h.Setup(&fakeSession{ctx: ctx, generation: 4}))
	require.NoError(t, r.Check(ctx))

	// A broker that leaves a request unanswered (stopped, not dead: its
	// partitions stall until the cluster fences it) makes it unready.
	hung := ""
	r.hung = func() (string, time.Duration) { return hung, 7 * time.Second }
	require.NoError(t, r.Check(ctx))
	hung = "127.0.0.1:9092"
	require.ErrorContains(t, r.Check(ctx), "Kafka: broker 127.0.0.1:9092 has not answered a request for 7s")
	hung = ""
	require.NoError(t, r.Check(ctx))

	// The database behind the binary: the latest migration not applied.
	_, err = pool.Exec(ctx, `UPDATE goose_db_version SET is_applied = false WHERE version_id = $1`, latest)
	require.NoError(t, err)
	require.ErrorContains(t, r.Check(ctx), "migrations: the database is at version")
	_, err = pool.Exec(ctx, `UPDATE goose_db_version SET is_applied = true WHERE version_id = $1`, latest)
	require.NoError(t, err)
	require.NoError(t, r.Check(ctx))

	pool.Close()
	require.ErrorContains(t, r.Check(ctx), "Postgres", "an unreachable database")
}

// TestConsumerLagSeries checks the lag arithmetic and that a revoked
// partition's series disappears.
func TestConsumerLagSeries(t *testing.T) {
	t.Parallel()
	lag := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lag"}, []string{"topic", "partition"})
	r := &readiness{}
	var during float64
	h := &observedHandler{ConsumerGroupHandler: markAll{after: func() { during = gaugeValue(t, lag, "prompts", "2") }}, ready: r, lag: lag}
	claim := &fakeClaim{topic: "prompts", partition: 2, initial: 10, hwm: 15, msgs: make(chan *sarama.ConsumerMessage, 8)}
	for off := int64(10); off < 13; off++ {
		claim.msgs <- &sarama.ConsumerMessage{Topic: "prompts", Partition: 2, Offset: off}
	}
	close(claim.msgs)
	require.NoError(t, h.ConsumeClaim(&fakeSession{ctx: t.Context()}, claim))
	require.Equal(t, 15.0-13.0, during, "high-water mark 15, offsets up to 12 marked: 2 behind")
	ch := make(chan prometheus.Metric, 1)
	lag.Collect(ch)
	require.Empty(t, ch, "the series is removed when the claim ends")
}

// The wakes' handler marks by offset (MarkOffset: a wake's offset is
// marked once every wake before it is done), not by message. The lag
// followed MarkMessage only: a wakes partition's lag grew with every wake
// since its assignment, and never went down, so the lag alert would page
// for good on a healthy consumer.
func TestConsumerLagFollowsMarkOffset(t *testing.T) {
	t.Parallel()
	lag := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lag"}, []string{"topic", "partition"})
	var during float64
	h := &observedHandler{ConsumerGroupHandler: markOffsets{after: func() { during = gaugeValue(t, lag, "wakes", "9") }}, ready: &readiness{}, lag: lag}
	claim := &fakeClaim{topic: "wakes", partition: 9, initial: 0, hwm: 6, msgs: make(chan *sarama.ConsumerMessage, 8)}
	for off := int64(0); off < 6; off++ {
		claim.msgs <- &sarama.ConsumerMessage{Topic: "wakes", Partition: 9, Offset: off}
	}
	close(claim.msgs)
	require.NoError(t, h.ConsumeClaim(&fakeSession{ctx: t.Context()}, claim))
	require.Equal(t, 0.0, during, "every wake marked: none behind")
}

// markOffsets marks every message of the claim by its offset, as the
// pipeline's wakes handler does, then calls after; an offset lower than
// one marked already changes nothing, as in Sarama.
type markOffsets struct {
	nopHandler
	after func()
}

func (h markOffsets) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkOffset(m.Topic, m.Partition, m.Offset+1, "")
		s.MarkOffset(m.Topic, m.Partition, 0, "")
	}
	h.after()
	return nil
}

func gaugeValue(t *testing.T, vec *prometheus.GaugeVec, labels ...string) float64 {
	t.Helper()
	g, err := vec.GetMetricWithLabelValues(labels...)
	require.NoError(t, err)
	ch := make(chan prometheus.Metric, 1)
	g.Collect(ch)
	m := <-ch
	pb := &dto.Metric{}
	require.NoError(t, m.Write(pb))
	return pb.GetGauge().GetValue()
}

type nopHandler struct{}

func (nopHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (nopHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (nopHandler) ConsumeClaim(sarama.ConsumerGroupSession, sarama.ConsumerGroupClaim) error {
	return nil
}

// markAll marks every message of the claim, as the pipeline does once a
// message is durable, then calls after.
type markAll struct {
	nopHandler
	after func()
}

func (h markAll) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
	}
	h.after()
	return nil
}

// fakeSession and fakeClaim stand in for Sarama's in this unit test of the
// wrapper alone; the process tests below run the real consumer group.
type fakeSession struct {
	sarama.ConsumerGroupSession
	ctx        context.Context
	generation int32
}

func (s *fakeSession) Context() context.Context                    { return s.ctx }
func (s *fakeSession) GenerationID() int32                         { return s.generation }
func (s *fakeSession) MarkMessage(*sarama.ConsumerMessage, string) {}
func (s *fakeSession) MarkOffset(string, int32, int64, string)     {}

type fakeClaim struct {
	topic     string
	partition int32
	initial   int64
	hwm       int64
	msgs      chan *sarama.ConsumerMessage
}

func (c *fakeClaim) Topic() string                            { return c.topic }
func (c *fakeClaim) Partition() int32                         { return c.partition }
func (c *fakeClaim) InitialOffset() int64                     { return c.initial }
func (c *fakeClaim) HighWaterMarkOffset() int64               { return c.hwm }
func (c *fakeClaim) Messages() <-chan *sarama.ConsumerMessage { return c.msgs }

// TestHealthMetricsAndLogs runs a consumer and checks its operator's view:
// /healthz and /readyz, the metrics a turn feeds (with Go and process
// collectors), per-partition lag, the database gauges — and that the
// prompt's text never reaches its logs (at debug level).
func TestHealthMetricsAndLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.start(t, "consumer", "")
	line := c.waitLog(t, "consumer running", 30*time.Second)
	base := "http://" + line["metrics_addr"].(string)

	code, body := httpGet(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	require.Eventually(t, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "the consumer becomes ready once its group is joined")
	_, body = httpGet(t, base+"/readyz")
	require.Equal(t, "ready\n", body)

	// A secret-looking prompt: neither it nor the scripted echo of it may
	// appear in any log line.
	const secret = "zebra-quokka-7f3c91 my password is hunter2"
	p := prompt("s-health", secret)
	b.send(t, p)
	b.events.waitTurn(t, p.MessageID)

	var exposition string
	require.Eventually(t, func() bool {
		_, exposition = httpGet(t, base+"/metrics")
		v, ok := metricValue(exposition, `promptline_provider_attempts_total{outcome="succeeded"}`)
		// The relay observes the publish delay once it has marked the
		// rows, which may come after the turn.
		d, dok := metricValue(exposition, "promptline_outbox_publish_delay_seconds_count")
		return ok && v >= 1 && dok && d >= 1
	}, 10*time.Second, 50*time.Millisecond, "a provider attempt and a publication are counted")
	for series, atLeast := range map[string]float64{
		"promptline_ready":             1,
		"promptline_database_stats_up": 1,
		`promptline_admissions_total{outcome="admitted",reason=""}`:      1,
		"promptline_wake_to_start_seconds_count":                         1,
		"promptline_outbox_publish_delay_seconds_count":                  1,
		`promptline_provider_attempt_seconds_count{outcome="succeeded"}`: 1,
		`promptline_claims_total{event="acquired"}`:                      1,
		"promptline_outbox_backlog_rows":                                 0,
		"promptline_outbox_oldest_unpublished_seconds":                   0,
		"promptline_permission_requests_pending":                         0,
		"go_goroutines":                                                  1,
		"process_resident_memory_bytes":                                  1,
	} {
		v, ok := metricValue(exposition, series)
		require.True(t, ok, "no sample %s in\n%s", series, exposition)
		require.GreaterOrEqual(t, v, atLeast, series)
	}
	// Each prompt is counted once by its classification: a conflict as
	// outcome conflict, not again as a reject with reason conflict when
	// its reject is published; a malformed one as rejected, by reason.
	conflicting := p
	conflicting.Text = "another payload"
	b.send(t, conflicting)
	b.sendRaw(t, "s-health", []byte(`{"message_id":`))
	require.Eventually(t, func() bool {
		_, exposition = httpGet(t, base+"/metrics")
		c, cok := metricValue(exposition, `promptline_admissions_total{outcome="conflict",reason=""}`)
		r, rok := metricValue(exposition, `promptline_admissions_total{outcome="rejected",reason="invalid_json"}`)
		return cok && c == 1 && rok && r == 1
	}, 20*time.Second, 50*time.Millisecond, "the conflict and the malformed prompt are counted:\n%s", exposition)
	// Same session, same partition, sent after the conflict: its reject
	// is published after the conflict's, which is therefore counted by now.
	_, counted := metricValue(exposition, `promptline_admissions_total{outcome="rejected",reason="conflict"}`)
	require.False(t, counted, "a conflict counted twice:\n%s", exposition)
	var prompts float64
	for _, l := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(l, "promptline_admissions_total{") {
			v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			require.NoError(t, err, l)
			prompts += v
		}
	}
	require.Equal(t, 3.0, prompts, "three prompts, each counted once:\n%s", exposition)

	lagSeries := regexp.MustCompile(`(?m)^promptline_kafka_consumer_lag_messages\{partition="\d+",topic="(prompts|wakes|permission-replies)"\} \d+$`)
	require.Len(t, lagSeries.FindAllString(exposition, -1), 3*testPartitions,
		"one lag series per owned partition of the three topics:\n%s", exposition)

	require.NotEmpty(t, findLog(c.stderr.String(), "partitions assigned"), "the process logs at debug level")
	c.stop(t)
	logs := c.stderr.String()
	for _, fragment := range []string{secret, "zebra-quokka-7f3c91", "hunter2"} {
		require.NotContains(t, logs, fragment, "prompt text reached the logs")
	}
	// Logs are JSON; the turn's lines carry the identifying attributes.
	for l := range strings.Lines(logs) {
		require.True(t, strings.HasPrefix(l, "{"), "not a JSON log line: %q", l)
	}
	started := findLog(logs, "turn started")
	require.NotNil(t, started, logs)
	require.Equal(t, "s-health", started["session_id"])
	require.Equal(t, []any{p.MessageID}, started["message_ids"])
	require.NotEmpty(t, started["execution_id"])
	require.NotEmpty(t, started["fencing_token"])
}

// TestLocalWakesFlag: by default a prompt admitted here runs from a local
// wake, and its wake from Kafka is then taken by that run
// (promptline_wakes_total{result="local"}); with --local-wakes=false the
// wake from Kafka starts the run.
func TestLocalWakesFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag                 string
		wantLocal, wantStart float64
	}{
		{"--local-wakes=true", 1, 1},
		{"--local-wakes=false", 0, 1},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.start(t, "consumer", "", tc.flag)
			base := "http://" + c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
			p := prompt("s-local", "hello")
			b.send(t, p)
			require.Equal(t, "turn.completed", b.events.waitTurn(t, p.MessageID).Type)
			var exposition string
			require.Eventually(t, func() bool {
				_, exposition = httpGet(t, base+"/metrics")
				local, _ := metricValue(exposition, `promptline_wakes_total{result="local"}`)
				started, _ := metricValue(exposition, `promptline_wakes_total{result="started"}`)
				return local == tc.wantLocal && started == tc.wantStart
			}, 10*time.Second, 50*time.Millisecond, "wakes counted: want local %v, started %v", tc.wantLocal, tc.wantStart)
			// No wake joined a run already going: each ran once.
			_, exposition = httpGet(t, base+"/metrics")
			coalesced, _ := metricValue(exposition, `promptline_wakes_total{result="coalesced"}`)
			require.Zero(t, coalesced, exposition)
			c.stop(t)
		})
	}
}

// TestOutboxRetention: a consumer deletes the outbox rows it published once
// they are older than --outbox-retention, counts them, and leaves alone
// what it has not published. With retention 0 it keeps everything.
//
// It catches: a pruner that is not started, one that ignores the flag,
// one that deletes rows still to publish, and an uncounted deletion.
func TestOutboxRetention(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retention string
		pruned    bool
	}{{"1s", true}, {"0", false}} {
		t.Run(tc.retention, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.start(t, "consumer", "", "--outbox-retention", tc.retention)
			base := "http://" + c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
			p := prompt("s-retention", "hello")
			b.send(t, p)
			require.Equal(t, "turn.completed", b.events.waitTurn(t, p.MessageID).Type)
			published := b.count(t, `SELECT count(*) FROM outbox WHERE key = 's-retention'`)
			require.GreaterOrEqual(t, published, 3, "input.admitted, the wake, turn.completed")
			// A quarantined row is never published, so never pruned.
			_, err := b.pool.Exec(t.Context(), `INSERT INTO outbox (topic, key, payload, quarantine_reason, quarantined_at)
				VALUES ('session-events', 'kept', '\x00', 'test', now())`)
			require.NoError(t, err)

			if !tc.pruned {
				// Two intervals of a 1s retention, had it been set.
				require.Never(t, func() bool {
					return b.count(t, `SELECT count(*) FROM outbox WHERE key = 's-retention'`) < published
				}, 2500*time.Millisecond, 100*time.Millisecond, "retention 0 keeps published rows")
				_, exposition := httpGet(t, base+"/metrics")
				n, _ := metricValue(exposition, "promptline_outbox_pruned_total")
				require.Zero(t, n)
				return
			}
			require.Eventually(t, func() bool {
				return b.count(t, `SELECT count(*) FROM outbox WHERE key = 's-retention'`) == 0
			}, 20*time.Second, 100*time.Millisecond, "published rows deleted after the retention")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox WHERE key = 'kept'`), "the quarantined row stays")
			_, exposition := httpGet(t, base+"/metrics")
			n, _ := metricValue(exposition, "promptline_outbox_pruned_total")
			require.GreaterOrEqual(t, n, float64(published), exposition)
		})
	}
}

// TestLedgerRetention: a consumer deletes the ledger rows (provider
// attempts, tool calls) of a settled execution of an idle session once
// they are older than --ledger-retention, and counts them by table. With
// retention 0 it keeps everything.
//
// It catches: a ledger pruner that is not started, one that ignores the
// flag, and an uncounted deletion.
func TestLedgerRetention(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retention string
		pruned    bool
	}{{"1s", true}, {"0", false}} {
		t.Run(tc.retention, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := b.start(t, "consumer", "", "--ledger-retention", tc.retention)
			base := "http://" + c.waitLog(t, "consumer running", 30*time.Second)["metrics_addr"].(string)
			p := prompt("s-ledger-retention", `/tool echo {"text":"kept until pruned"}`)
			b.send(t, p)
			require.Equal(t, "turn.completed", b.events.waitTurn(t, p.MessageID).Type)
			attempts := b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's-ledger-retention'`)
			calls := b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's-ledger-retention'`)
			require.Equal(t, 2, attempts, "the step that called the tool, the step that answered")
			require.Equal(t, 1, calls)
			prunedOf := func(table string) float64 {
				_, exposition := httpGet(t, base+"/metrics")
				n, ok := metricValue(exposition, `promptline_ledger_pruned_total{table="`+table+`"}`)
				require.True(t, ok, "the series exists before any prune: %s", exposition)
				return n
			}

			if !tc.pruned {
				// Two intervals of a 1s retention, had it been set.
				require.Never(t, func() bool {
					return b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's-ledger-retention'`) < attempts
				}, 2500*time.Millisecond, 100*time.Millisecond, "retention 0 keeps the ledger")
				require.Zero(t, prunedOf("attempts"))
				require.Zero(t, prunedOf("tool_calls"))
				return
			}
			require.Eventually(t, func() bool {
				return b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's-ledger-retention'`) == 0 &&
					b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's-ledger-retention'`) == 0
			}, 20*time.Second, 100*time.Millisecond, "the settled execution's rows deleted after the retention")
			require.Eventually(t, func() bool {
				return prunedOf("attempts") >= float64(attempts) && prunedOf("tool_calls") >= float64(calls)
			}, 5*time.Second, 50*time.Millisecond, "deletions counted by table")
		})
	}
}
