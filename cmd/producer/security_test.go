package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// runCLIEnv is runCLI with its own environment settings.
func runCLIEnv(ctx context.Context, env []string, args ...string) result {
	var stdout, stderr bytes.Buffer
	root := newRootCommandEnv(strings.NewReader(""), &stdout, &stderr, func() []string { return env })
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return result{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

// TestSecurity: send over TLS with SASL SCRAM-SHA-256 to the embedded
// broker configured for them; a wrong password fails saying what to check.
func TestSecurity(t *testing.T) {
	t.Parallel()
	ca := testkit.NewCA(t, "promptline test CA")
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", TLS: ca.ServerTLS(t), Partitions: 2,
		Topics:    []string{"prompts"},
		SASLUsers: []kafkautil.SASLUser{{Mechanism: kafkautil.SASLScramSHA256, User: "promptline", Password: "s3cret"}}})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	caFile := testkit.WriteFile(t, "ca.pem", ca.PEM)
	pass := testkit.WriteFile(t, "password", []byte("s3cret\n"))
	flags := func(passFile string) []string {
		return []string{"--brokers", b.Addr(), "--tls", "--tls-ca-file", caFile,
			"--sasl-mechanism", "SCRAM-SHA-256", "--sasl-user", "promptline", "--sasl-password-file", passFile}
	}
	// Cleanup, not defer: the parallel subtests run after this function
	// returns, and the commands now honour their context.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)

	t.Run("SendWorks", func(t *testing.T) {
		t.Parallel()
		r := runCLI(ctx, "", append(flags(pass), "send", "--session", "s-tls", "--text", "over TLS", "--message-id", "m-tls")...)
		require.NoError(t, r.err, r.stderr)
		require.Regexp(t, `^prompts/\d+/\d+ message_id=m-tls\n$`, r.stdout)

		// Read back with the same security settings.
		cfg := kafkautil.NewConfig("security-read")
		require.NoError(t, kafkautil.Security{TLS: true, CAFile: caFile, SASLMechanism: "SCRAM-SHA-256", SASLUser: "promptline", SASLPasswordFile: pass}.Apply(cfg))
		p, err := envelope.Decode([]byte("s-tls"), readOne(t, b.Addr(), cfg, "prompts", "m-tls"), envelope.Limits{})
		require.NoError(t, err)
		require.Equal(t, "over TLS", p.Text)
	})

	t.Run("SendFromEnvAndFile", func(t *testing.T) {
		t.Parallel()
		file := testkit.WriteFile(t, "producer.yaml", []byte("tls: true\ntls-ca-file: "+caFile+"\nsasl-mechanism: SCRAM-SHA-256\nsasl-user: promptline\n"))
		env := []string{"PROMPTLINE_BROKERS=" + b.Addr(), "PROMPTLINE_SASL_PASSWORD_FILE=" + pass}
		r := runCLIEnv(ctx, env, "send", "--config", file, "--session", "s-env", "--text", "configured")
		require.NoError(t, r.err, r.stderr)
		require.Contains(t, r.stdout, "prompts/")
	})

	t.Run("WrongPasswordFails", func(t *testing.T) {
		t.Parallel()
		wrong := testkit.WriteFile(t, "wrong", []byte("guess"))
		r := runCLI(ctx, "", append(flags(wrong), "send", "--session", "s-tls", "--text", "x")...)
		require.Error(t, r.err)
		require.ErrorContains(t, r.err, "connecting to "+b.Addr())
		require.ErrorContains(t, r.err, "SASL SCRAM-SHA-256 authentication may have failed: check --sasl-user and --sasl-password-file")
	})

	t.Run("UntrustedCAFails", func(t *testing.T) {
		t.Parallel()
		other := testkit.WriteFile(t, "other.pem", testkit.NewCA(t, "someone else").PEM)
		args := flags(pass)
		args[4] = other
		r := runCLI(ctx, "", append(args, "watch", "--timeout", "1s")...)
		require.ErrorContains(t, r.err, "check --tls-ca-file")
	})

	t.Run("UnknownEnvFails", func(t *testing.T) {
		t.Parallel()
		r := runCLIEnv(ctx, []string{"PROMPTLINE_BROKER=" + b.Addr()}, "send", "--session", "s", "--text", "x")
		require.ErrorContains(t, r.err, "environment variable PROMPTLINE_BROKER: unknown setting")
	})
}

// readOne finds the record of msgID (by its envelope) in topic.
func readOne(t *testing.T, addr string, cfg *sarama.Config, topic, msgID string) []byte {
	t.Helper()
	c, err := sarama.NewConsumer([]string{addr}, cfg)
	require.NoError(t, err)
	defer c.Close()
	parts, err := c.Partitions(topic)
	require.NoError(t, err)
	deadline := time.After(30 * time.Second)
	for _, p := range parts {
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		require.NoError(t, err)
		hwm := pc.HighWaterMarkOffset()
		for n := int64(0); n < hwm; n++ {
			select {
			case m := <-pc.Messages():
				if strings.Contains(string(m.Value), msgID) {
					pc.Close()
					return m.Value
				}
			case <-deadline:
				require.FailNow(t, "reading "+topic)
			}
		}
		require.NoError(t, pc.Close())
	}
	require.FailNow(t, "no record of "+msgID)
	return nil
}
