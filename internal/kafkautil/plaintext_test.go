package kafkautil_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
)

// TestWarnPlaintextSASL: SASL credentials sent without TLS to a broker off
// this machine get one warning at start, naming the mechanism and the
// brokers, as a plaintext Postgres connection does.
func TestWarnPlaintextSASL(t *testing.T) {
	t.Parallel()
	remote := []string{"kafka-1.internal:9092", "10.0.0.7:9092"}
	for _, tc := range []struct {
		name    string
		sec     kafkautil.Security
		brokers []string
		warn    bool
	}{
		{"PlainRemote", kafkautil.Security{SASLMechanism: "plain"}, remote, true},
		{"ScramRemote", kafkautil.Security{SASLMechanism: kafkautil.SASLScramSHA512}, remote, true},
		{"OAuthRemote", kafkautil.Security{SASLMechanism: kafkautil.SASLOAuthBearer}, remote, true},
		{"OneRemoteAmongLoopback", kafkautil.Security{SASLMechanism: kafkautil.SASLPlain}, []string{"127.0.0.1:9092", "kafka-1.internal:9092"}, true},
		{"PlainWithTLS", kafkautil.Security{SASLMechanism: kafkautil.SASLPlain, TLS: true}, remote, false},
		{"PlainLoopback", kafkautil.Security{SASLMechanism: kafkautil.SASLPlain}, []string{"127.0.0.1:9092", "localhost:9093", "[::1]:9094"}, false},
		{"NoSASL", kafkautil.Security{}, remote, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tc.sec.WarnPlaintext(context.Background(), slog.New(slog.NewJSONHandler(&buf, nil)), tc.brokers)
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if !tc.warn {
				require.Empty(t, strings.TrimSpace(buf.String()))
				return
			}
			require.Len(t, lines, 1, "one warning")
			var line map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[0]), &line))
			require.Equal(t, "WARN", line["level"])
			require.Contains(t, line["msg"], "--tls")
			require.Equal(t, strings.ToUpper(tc.sec.SASLMechanism), line["mechanism"])
			require.ElementsMatch(t, toAny(tc.brokers), line["brokers"])
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
