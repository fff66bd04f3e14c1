package cliconfig

import (
	"slices"

	"github.com/spf13/cobra"
)

// Programs lists the settings (flag names) of each promptline program.
//
// One environment or one config file often serves both programs (a
// ConfigMap loaded into every container of a pod, say): a variable or a
// key of the other program is then left alone, while one that no program
// knows — a typo — still stops the program, naming it. The lists are
// written out, not derived, because neither program can import the
// other's command tree; each program's tests check its list against its
// flags (Settings), so that a flag added without its entry fails there.
var Programs = map[string][]string{
	"consumer": {
		"addr", "all", "any-reason", "brokers", "buffer-bytes", "config", "console-token-file", "create-topics", "data-dir", "database-url",
		"db-idle-in-transaction-timeout", "db-lock-timeout", "db-max-conns", "db-round-trip-timeout", "db-statement-timeout", "deltas-topic",
		"decision", "did-not-run", "dry-run", "embedded-kafka-addr", "events-topic", "from-offset", "from-time", "group",
		"http-tool-endpoint", "json", "lease", "ledger-retention", "local-wakes", "log-level", "max-batch",
		"max", "max-message-bytes", "max-rejections", "mcp-server", "max-sessions", "max-value-bytes", "metrics-addr", "migrate", "note",
		"openai-api-key-env", "openai-api-key-file", "openai-base-url", "openai-model", "openai-stream", "operator",
		"outbox-retention", "output", "partitions", "permission-replies-topic", "progress-interval",
		"prompts-topic", "provider", "provider-honours-idempotency-keys", "provider-url",
		"publish-rejects", "ran", "rate", "reason-contains", "recovery-batch", "recovery-interval", "recovery-max-per-session",
		"recovery-max-per-session-window", "recovery-mode", "recovery-rate", "redrive-after",
		"rejects-topic", "replication-factor", "resume-file", "round", "sandbox-dir", "sasl-mechanism", "session",
		"sasl-password-file", "sasl-token-file", "sasl-user", "shutdown-grace", "stop-grace", "tls", "tls-ca-file",
		"tls-cert-file", "tls-key-file", "tls-server-name", "to-offset", "to-time", "tool-class", "tool-permission", "tool-timeout",
		"topic", "wake", "wakes-topic",
	},
	"producer": {
		"brokers", "config", "count", "deltas", "deltas-topic", "delivery", "file", "from-beginning", "json", "message",
		"message-id", "no-resume", "partitioner", "request", "sasl-mechanism", "sasl-password-file",
		"sasl-token-file", "sasl-user", "session", "text", "timeout", "tls", "tls-ca-file",
		"tls-cert-file", "tls-key-file", "tls-server-name", "topic", "type",
	},
}

// Settings lists, sorted, the flag names of every command of root's tree:
// the keys its environment variables and config file may set.
func Settings(root *cobra.Command) []string {
	known := knownKeys(root)
	out := make([]string, 0, len(known))
	for k := range known {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// siblingSettings lists the settings of the programs other than program;
// none when program is empty (every unknown key is refused).
func siblingSettings(program string) map[string]bool {
	if program == "" {
		return nil
	}
	out := map[string]bool{}
	for name, settings := range Programs {
		if name == program {
			continue
		}
		for _, s := range settings {
			out[s] = true
		}
	}
	return out
}
