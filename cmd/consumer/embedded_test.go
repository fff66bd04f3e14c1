package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// freeAddr returns a loopback address with a port that was free a moment
// ago (for a flag that must be given a concrete port).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestEmbeddedBroker runs the consumer without --brokers: it starts its own
// broker on --embedded-kafka-addr, creates the topics, and serves prompts
// there; its metrics endpoint reports the Go runtime and admissions.
func TestEmbeddedBroker(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	p := startProc(t, "consumer", "", "--embedded-kafka-addr", addr, "--database-url", testkit.DatabaseURL(t),
		"--metrics-addr", "127.0.0.1:0", "--partitions", fmt.Sprint(testPartitions), "--group", "embedded")
	started := p.waitLog(t, "embedded Kafka broker started", 30*time.Second)
	require.Equal(t, addr, started["addr"])
	running := p.waitLog(t, "consumer running", 30*time.Second)
	require.Equal(t, []any{addr}, running["brokers"])
	metricsAddr, ok := running["metrics_addr"].(string)
	require.True(t, ok, "consumer running: %v", running)

	// The topics were created with --partitions before "consumer running".
	client, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("test-metadata"))
	require.NoError(t, err)
	for _, topic := range (kafkautil.Topics{}).WithDefaults().All() {
		parts, err := client.Partitions(topic)
		require.NoError(t, err, topic)
		require.Len(t, parts, testPartitions, topic)
	}
	require.NoError(t, client.Close())

	events := readTopic(t, addr, "session-events")
	pr := prompt("s-embedded", "embedded")
	sendPrompt(t, newProducer(t, addr), pr)
	turn := events.waitTurn(t, pr.MessageID)
	require.Equal(t, envelope.EventTurnCompleted, turn.Type)
	require.Equal(t, "echo: embedded", turn.Text)

	httpc := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) string {
		res, err := httpc.Get("http://" + metricsAddr + path)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
		return string(body)
	}
	require.Equal(t, "ok\n", get("/healthz"))
	metrics := get("/metrics")
	require.Contains(t, metrics, "\ngo_goroutines ")
	require.Regexp(t, `(?m)^promptline_admissions_total\{[^}]*outcome="admitted"[^}]*\} 1$`, metrics)
	require.Regexp(t, `(?m)^promptline_turns_total\{[^}]*\} 1$`, metrics)
	// The series the alert rules select on exist before their first
	// increment, so that rate() sees it.
	for _, zero := range []string{
		`promptline_provider_attempts_total{outcome="unknown"}`,
		`promptline_tool_calls_total{outcome="unknown"}`,
		`promptline_recovery_decisions_total{decision="reconciled"}`,
		`promptline_recovery_decisions_total{decision="quarantined"}`,
	} {
		v, ok := metricValue(metrics, zero)
		require.True(t, ok, "%s is not exposed", zero)
		require.Zero(t, v, zero)
	}
	v, ok := metricValue(metrics, `promptline_provider_attempts_total{outcome="succeeded"}`)
	require.True(t, ok)
	require.Equal(t, 1.0, v, "the turn's one attempt")
}

// TestBrokerCommand runs "consumer broker" alone with a data directory: what
// was produced to it survives a SIGTERM and a restart on the same directory.
func TestBrokerCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(name string) (*proc, string) {
		p := startProc(t, name, "", "broker", "--addr", "127.0.0.1:0", "--data-dir", dir, "--partitions", "2")
		ready := p.waitLog(t, "embedded broker ready", 30*time.Second)
		require.Equal(t, dir, ready["data_dir"])
		addr, ok := ready["addr"].(string)
		require.True(t, ok, "embedded broker ready: %v", ready)
		return p, addr
	}

	first, addr := start("broker-1")
	producer, err := sarama.NewSyncProducer([]string{addr}, kafkautil.NewConfig("test-producer"))
	require.NoError(t, err)
	want := map[string]string{}
	for i := range 3 {
		k, v := fmt.Sprintf("s-%d", i), fmt.Sprintf("record %d", i)
		want[k] = v
		_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(v)})
		require.NoError(t, err)
	}
	require.NoError(t, producer.Close())
	st := first.stop(t)
	require.True(t, st.Success(), "SIGTERM stops the broker cleanly: %s", st)

	_, addr = start("broker-2")
	got := map[string]string{}
	for _, m := range testkit.ReadAll(t, addr, "prompts") {
		got[string(m.Key)] = string(m.Value)
	}
	require.Equal(t, want, got)
}
