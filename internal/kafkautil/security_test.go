package kafkautil_test

import (
	"os"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// connect lists topics with sec, the way every promptline client connects.
func connect(addr string, sec kafkautil.Security) error {
	cfg := kafkautil.NewConfig("security-test")
	if err := sec.Apply(cfg); err != nil {
		return err
	}
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 0
	admin, err := sarama.NewClusterAdmin([]string{addr}, cfg)
	if err != nil {
		return sec.Explain(err)
	}
	defer admin.Close()
	_, err = admin.ListTopics()
	return sec.Explain(err)
}

func TestSecurity(t *testing.T) {
	t.Parallel()
	ca := testkit.NewCA(t, "promptline test CA")
	caFile := testkit.WriteFile(t, "ca.pem", ca.PEM)
	pass := testkit.WriteFile(t, "pass", []byte("s3cret\n"))
	wrong := testkit.WriteFile(t, "wrong", []byte("guess"))

	t.Run("TLSWithScram", func(t *testing.T) {
		t.Parallel()
		for _, mech := range []string{kafkautil.SASLScramSHA256, kafkautil.SASLScramSHA512, kafkautil.SASLPlain} {
			b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", TLS: ca.ServerTLS(t), Topics: []string{"prompts"},
				SASLUsers: []kafkautil.SASLUser{{Mechanism: mech, User: "promptline", Password: "s3cret"}}})
			require.NoError(t, err)
			ok := kafkautil.Security{TLS: true, CAFile: caFile, SASLMechanism: mech, SASLUser: "promptline", SASLPasswordFile: pass}
			require.NoError(t, connect(b.Addr(), ok), mech)

			bad := ok
			bad.SASLPasswordFile = wrong
			err = connect(b.Addr(), bad)
			require.Error(t, err, "%s: a wrong password must fail", mech)
			require.Contains(t, err.Error(), "authentication may have failed", "%s: the error says what to check: %v", mech, err)
			b.Close()
		}
	})

	t.Run("UntrustedCertificateFails", func(t *testing.T) {
		t.Parallel()
		b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", TLS: ca.ServerTLS(t)})
		require.NoError(t, err)
		defer b.Close()
		other := testkit.WriteFile(t, "other.pem", testkit.NewCA(t, "someone else").PEM)
		err = connect(b.Addr(), kafkautil.Security{TLS: true, CAFile: other})
		require.Error(t, err)
		require.Contains(t, err.Error(), "certificate", "the error names the certificate problem: %v", err)
		require.Contains(t, err.Error(), "--tls-ca-file")
		// Trusted, it works: the failure above was the trust, nothing else.
		require.NoError(t, connect(b.Addr(), kafkautil.Security{TLS: true, CAFile: caFile}))
	})

	t.Run("SettingsAreValidated", func(t *testing.T) {
		t.Parallel()
		cfg := kafkautil.NewConfig("x")
		for sec, flag := range map[*kafkautil.Security]string{
			{CAFile: caFile}: "--tls",
			{TLS: true, CAFile: "/nonexistent/ca.pem"}:       "--tls-ca-file",
			{TLS: true, CertFile: caFile}:                    "--tls-cert-file and --tls-key-file",
			{SASLMechanism: "GSSAPI"}:                        "--sasl-mechanism",
			{SASLMechanism: "PLAIN", SASLPasswordFile: pass}: "--sasl-user",
			{SASLMechanism: "PLAIN", SASLUser: "u"}:          "--sasl-password-file",
			{SASLMechanism: "OAUTHBEARER"}:                   "--sasl-token-file",
			// Ignored settings would connect without authenticating.
			{SASLUser: "u", SASLPasswordFile: pass}: "the SASL settings need --sasl-mechanism",
			{SASLTokenFile: pass}:                   "the SASL settings need --sasl-mechanism",
			{SASLMechanism: "PLAIN", SASLUser: "u", SASLPasswordFile: pass, SASLTokenFile: pass}: "--sasl-token-file: used with OAUTHBEARER only",
			{SASLMechanism: "OAUTHBEARER", SASLTokenFile: pass, SASLUser: "u"}:                   "not used with --sasl-mechanism OAUTHBEARER",
		} {
			err := sec.Apply(cfg)
			require.Error(t, err)
			require.Contains(t, err.Error(), flag)
		}
		token := testkit.WriteFile(t, "token", []byte("tok-1\n"))
		require.NoError(t, kafkautil.Security{SASLMechanism: "oauthbearer", SASLTokenFile: token}.Apply(cfg))
		tok, err := cfg.Net.SASL.TokenProvider.Token()
		require.NoError(t, err)
		require.Equal(t, "tok-1", tok.Token)
		require.NoError(t, os.WriteFile(token, []byte("tok-2"), 0o600))
		tok, err = cfg.Net.SASL.TokenProvider.Token()
		require.NoError(t, err)
		require.Equal(t, "tok-2", tok.Token, "a rotated token is read again")
	})

	t.Run("BrokerAddresses", func(t *testing.T) {
		t.Parallel()
		for _, ok := range []string{"127.0.0.1:9092", "kafka-0.kafka:9093", "[::1]:9092"} {
			require.NoError(t, kafkautil.CheckBrokerAddr(ok), ok)
		}
		for _, bad := range []string{"nohostport", "host:abc", ":::", "host:", "host:0", "host:65536"} {
			require.ErrorContains(t, kafkautil.CheckBrokerAddr(bad), "--brokers: ", bad)
		}
	})
}
