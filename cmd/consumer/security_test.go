package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// The consumer against the embedded broker speaking TLS only and requiring
// SASL SCRAM-SHA-256: a prompt runs end to end; a wrong password and an
// untrusted CA stop it at start, saying what to check.

// secureBundle is a TLS + SCRAM-SHA-256 broker, its CA and credentials.
type secureBundle struct {
	addr, caFile, passFile string
	sec                    kafkautil.Security
}

func setupSecure(t *testing.T) *secureBundle {
	t.Helper()
	ca := testkit.NewCA(t, "promptline test CA")
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", TLS: ca.ServerTLS(t), Partitions: testPartitions,
		Topics:    kafkautil.Topics{}.WithDefaults().All(),
		SASLUsers: []kafkautil.SASLUser{{Mechanism: kafkautil.SASLScramSHA256, User: "promptline", Password: "s3cret"}}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	s := &secureBundle{addr: b.Addr(), caFile: testkit.WriteFile(t, "ca.pem", ca.PEM), passFile: testkit.WriteFile(t, "password", []byte("s3cret\n"))}
	s.sec = kafkautil.Security{TLS: true, CAFile: s.caFile, SASLMechanism: kafkautil.SASLScramSHA256, SASLUser: "promptline", SASLPasswordFile: s.passFile}
	return s
}

// args are the consumer's flags for this broker, with a password file and
// a CA file of the caller's choosing.
func (s *secureBundle) args(t *testing.T, dbURL, caFile, passFile string) []string {
	return []string{"--brokers", s.addr, "--database-url", dbURL, "--metrics-addr", "127.0.0.1:0",
		"--partitions", "4", "--group", "secure-" + uuid.NewString(), "--log-level", "debug",
		"--tls", "--tls-ca-file", caFile,
		"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-user", "promptline", "--sasl-password-file", passFile}
}

func (s *secureBundle) config(t *testing.T) *sarama.Config {
	t.Helper()
	cfg := kafkautil.NewConfig("secure-test")
	require.NoError(t, s.sec.Apply(cfg))
	return cfg
}

func TestKafkaSecurity(t *testing.T) {
	t.Parallel()

	t.Run("TLSAndScramEndToEnd", func(t *testing.T) {
		t.Parallel()
		s := setupSecure(t)
		dbURL := testkit.DatabaseURL(t)
		cfg := s.config(t)
		events := readTopicWith(t, s.addr, cfg, "session-events")
		producer, err := sarama.NewSyncProducer([]string{s.addr}, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, producer.Close()) })

		c := startProc(t, "consumer-secure", "", s.args(t, dbURL, s.caFile, s.passFile)...)
		c.waitLog(t, "consumer running", 30*time.Second)
		p := prompt("s-secure", "over TLS")
		sendPrompt(t, producer, p)
		turn := events.waitTurn(t, p.MessageID)
		require.Equal(t, envelope.EventTurnCompleted, turn.Type)
		require.Equal(t, "echo: over TLS", turn.Text)
	})

	t.Run("WrongPasswordFailsAtStart", func(t *testing.T) {
		t.Parallel()
		s := setupSecure(t)
		wrong := testkit.WriteFile(t, "wrong", []byte("guess"))
		c := startProc(t, "consumer-wrong-password", "", s.args(t, testkit.DatabaseURL(t), s.caFile, wrong)...)
		st := c.waitExit(t, 60*time.Second)
		require.Equal(t, 1, st.ExitCode(), c.stderr.String())
		require.Contains(t, c.stderr.String(), "consumer: connecting to Kafka")
		require.Contains(t, c.stderr.String(), "SASL SCRAM-SHA-256 authentication may have failed: check --sasl-user and --sasl-password-file")
	})

	t.Run("UntrustedCAFailsAtStart", func(t *testing.T) {
		t.Parallel()
		s := setupSecure(t)
		other := testkit.WriteFile(t, "other.pem", testkit.NewCA(t, "someone else").PEM)
		c := startProc(t, "consumer-untrusted", "", s.args(t, testkit.DatabaseURL(t), other, s.passFile)...)
		st := c.waitExit(t, 60*time.Second)
		require.Equal(t, 1, st.ExitCode(), c.stderr.String())
		require.Contains(t, c.stderr.String(), "certificate signed by unknown authority")
		require.Contains(t, c.stderr.String(), "check --tls-ca-file")
	})

	t.Run("SecurityFlagsNeedBrokers", func(t *testing.T) {
		t.Parallel()
		_, err := runInProcess(t, nil, "--tls", "--database-url", "postgres://127.0.0.1:1/none")
		require.ErrorContains(t, err, "need --brokers")
		_, err = runInProcess(t, nil, "--brokers", "127.0.0.1:1", "--sasl-mechanism", "SCRAM-SHA-256", "--database-url", "postgres://127.0.0.1:1/none")
		require.ErrorContains(t, err, "--sasl-user")
		_, err = runInProcess(t, []string{"PROMPTLINE_SASL_MECHANISM=GSSAPI"}, "--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/none")
		require.ErrorContains(t, err, "--sasl-mechanism")
		require.ErrorContains(t, err, "set by env PROMPTLINE_SASL_MECHANISM")
	})
}

// TestSASLWithoutTLSWarnsAtStart: SASL PLAIN without TLS to a broker off
// this machine logs one warning at start, naming the mechanism and the
// brokers (the database is unreachable, so the consumer stops right after).
func TestSASLWithoutTLSWarnsAtStart(t *testing.T) {
	t.Parallel()
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	common := []string{"--sasl-mechanism", "PLAIN", "--sasl-user", "app", "--sasl-password-file", pw,
		"--database-url", "postgres://127.0.0.1:1/none", "--metrics-addr", "127.0.0.1:0"}
	const msg = "SASL without TLS to brokers off this machine: the credentials and all traffic travel unencrypted; set --tls (docs/deploy.md)"

	_, stderr, code := runOnce(t, append(common, "--brokers", "192.0.2.1:9092")...)
	require.Equal(t, 1, code, stderr)
	require.Equal(t, 1, strings.Count(stderr, msg), "one warning:\n%s", stderr)
	line := findLog(stderr, msg)
	require.Equal(t, "PLAIN", line["mechanism"])
	require.Equal(t, []any{"192.0.2.1:9092"}, line["brokers"])
	require.NotContains(t, stderr, "s3cret")

	_, stderr, code = runOnce(t, append(common, "--brokers", "127.0.0.1:1")...)
	require.Equal(t, 1, code, stderr)
	require.NotContains(t, stderr, msg, "a loopback broker stays on the machine")
}
