package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// runOnce runs the consumer binary to its end, bounded by a timeout (a
// flag that slipped through validation would otherwise start a consumer
// that runs until killed).
func runOnce(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runOnceEnv(t, nil, args...)
}

// runOnceEnv is runOnce with variables added to the environment.
func runOnceEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	cmd := exec.CommandContext(ctx, consumerBin, args...)
	cmd.Args[0] = "consumer"
	cmd.Env = append(append(os.Environ(), "PROMPTLINE_FAULT="), env...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "consumer %v did not exit; stderr:\n%s", args, e.String())
	var exit *exec.ExitError
	if err != nil {
		require.True(t, errors.As(err, &exit), "running consumer: %v", err)
		code = exit.ExitCode()
	}
	return o.String(), e.String(), code
}

// TestFlags runs the binary with bad flag values: each must stop it before
// it does anything, exit 1 and name the flag.
func TestFlags(t *testing.T) {
	t.Parallel()
	// Valid values for what is not under test: an unreachable broker and
	// database, so that a bad value that slipped through fails fast and
	// touches nothing on this machine.
	base := []string{"--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1",
		"--metrics-addr", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"PartitionsZero", []string{"--partitions", "0"}, "--partitions"},
		{"LogLevelLoud", []string{"--log-level", "loud"}, "--log-level"},
		{"LogLevelOffset", []string{"--log-level", "warn+3"}, "--log-level"},
		{"MaxSessionsNegative", []string{"--max-sessions", "-1"}, "--max-sessions"},
		{"BrokersWithoutPort", []string{"--brokers", "nohostport"}, "--brokers"},
		{"ShutdownGraceUnparsable", []string{"--shutdown-grace", "x"}, "--shutdown-grace"},
		{"LeaseTooShort", []string{"--lease", "1ms"}, "--lease"},
		{"OutboxRetentionTooShort", []string{"--outbox-retention", "10ms"}, "--outbox-retention"},
		{"LedgerRetentionTooShort", []string{"--ledger-retention", "10ms"}, "--ledger-retention"},
		{"MaxMessageBytesTooSmall", []string{"--max-message-bytes", "100"}, "--max-message-bytes"},
		{"MaxMessageBytesAboveRequestSize", []string{"--max-message-bytes", "104857600"}, "--max-message-bytes"},
		{"RecoveryMaxPerSessionNegative", []string{"--recovery-max-per-session", "-1"}, "--recovery-max-per-session:"},
		{"RecoveryMaxPerSessionWindowNegative", []string{"--recovery-max-per-session-window", "-1s"}, "--recovery-max-per-session-window:"},
		{"RecoveryRateNegative", []string{"--recovery-rate", "-1"}, "--recovery-rate: must be 0 (unbounded) or a positive number"},
		{"RecoveryRateNaN", []string{"--recovery-rate", "NaN"}, "--recovery-rate: must be 0 (unbounded) or a positive number"},
		{"RecoveryRateInf", []string{"--recovery-rate", "+Inf"}, "--recovery-rate: must be 0 (unbounded) or a positive number"},
		{"RoundTripTimeoutTooShort", []string{"--db-round-trip-timeout", "10ms"}, "--db-round-trip-timeout: must be 0"},
		{"RoundTripTimeoutNegative", []string{"--db-round-trip-timeout", "-1s"}, "--db-round-trip-timeout: must be 0"},
		{"RoundTripTimeoutShorterThanLease", []string{"--db-round-trip-timeout", "5s", "--lease", "10s"}, "--db-round-trip-timeout: must not be shorter than --lease"},
		{"UnknownFlag", []string{"--no-such-flag"}, "--no-such-flag"},
		// One topic for two kinds of message: rejects published into the
		// prompts topic are read back as prompts, rejected again, for ever.
		{"RejectsTopicIsPrompts", []string{"--rejects-topic", "prompts"}, `--rejects-topic: "prompts" is also --prompts-topic`},
		{"WakesTopicIsEvents", []string{"--wakes-topic", "e", "--events-topic", "e"}, `--events-topic: "e" is also --wakes-topic`},
		{"BrokersPortNotANumber", []string{"--brokers", "host:abc"}, `--brokers: "host:abc" is not host:port`},
		{"BrokersOnlyColons", []string{"--brokers", ":::"}, `--brokers: ":::" is not host:port`},
		{"RedriveAfterZero", []string{"--redrive-after", "0"}, "--redrive-after: must be positive"},
		// Checked with the flags, before the database is opened.
		{"ProviderURLNotAURL", []string{"--provider", "http", "--provider-url", "model.internal/v1"}, "--provider-url: "},
		{"OpenAIBaseURLNotAURL", []string{"--provider", "openai", "--openai-model", "m", "--openai-base-url", "notaurl"}, `--openai-base-url: openai provider config: BaseURL "notaurl" is not an absolute http or https URL`},
		{"OpenAIKeyMissing", []string{"--provider", "openai", "--openai-model", "m", "--openai-api-key-env", "PROMPTLINE_TEST_NO_SUCH_KEY"}, "--openai-api-key-env/--openai-api-key-file: "},
		{"MetricsAddrEmpty", []string{"--metrics-addr", ""}, `--metrics-addr: "" is not host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runOnce(t, append(append([]string{}, base...), tc.args...)...)
			require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			require.Regexp(t, `^consumer: `, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}

	t.Run("MetricsAddrInUse", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		addr := testkit.Broker(t, testPartitions).Addr()
		stdout, stderr, code := runOnce(t, "--brokers", addr, "--database-url", testkit.DatabaseURL(t),
			"--metrics-addr", ln.Addr().String(), "--partitions", "4", "--group", "flags")
		require.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		require.Contains(t, stderr, "consumer: --metrics-addr: ")
		require.Contains(t, stderr, "address already in use")
	})

	t.Run("Help", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := runOnce(t, "--help")
		require.Equal(t, 0, code, stderr)
		for _, flag := range []string{"--brokers", "--database-url", "--metrics-addr", "--group", "--log-level",
			"--embedded-kafka-addr", "--partitions", "--shutdown-grace", "--max-sessions"} {
			require.Contains(t, stdout, flag)
		}
		require.Contains(t, stdout, "broker", "the broker subcommand is listed")
	})

	t.Run("RecoveryPlanMaxPerSessionNegative", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := runOnce(t, "recovery", "plan", "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1",
			"--recovery-max-per-session", "-2")
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "--recovery-max-per-session: must not be negative")
	})

	// A rate that paces nothing must not pass for one: NaN and +Inf, and a
	// rate so small that its interval overflows a duration, would each
	// apply or replay at full speed (the interval converted from a NaN or
	// from too large a float is negative in Go).
	for _, tc := range []struct{ name, cmd, rate, want string }{
		{"ReplayRateNaN", "replay", "NaN", "--rate: must be 0 (no cap) or a finite number"},
		{"ReplayRateInf", "replay", "+Inf", "--rate: must be 0 (no cap) or a finite number"},
		{"ReplayRateTooSmall", "replay", "1e-12", "--rate: must be 0 (no cap) or a finite number of messages per second, at least 1e-9, got 1e-12"},
		{"ApplyRateNaN", "apply", "NaN", "--rate: must be a finite number"},
		{"ApplyRateInf", "apply", "+Inf", "--rate: must be a finite number"},
		{"ApplyRateTooSmall", "apply", "1e-12", "--rate: must be a finite number of decisions per second, at least 1e-9, got 1e-12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"replay", "--brokers", "127.0.0.1:1"}
			if tc.cmd == "apply" {
				args = []string{"recovery", "apply", "--operator", "alice"}
			}
			args = append(args, "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1", "--rate", tc.rate)
			_, stderr, code := runOnce(t, args...)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}

	// Replay's topics: an empty name was defaulted, so --rejects-topic ""
	// with --publish-rejects on the rejects topic published into what it
	// read.
	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{"ReplayRejectsTopicEmpty", `--rejects-topic: must not be empty`,
			[]string{"--topic", "prompts.rejects", "--publish-rejects", "--rejects-topic", ""}},
		{"ReplayWakesTopicIsPrompts", `--wakes-topic: "prompts" is also --prompts-topic`, []string{"--wakes-topic", "prompts"}},
		{"ReplayBrokersPortNotANumber", `--brokers: "h:x" is not host:port`, []string{"--brokers", "h:x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"replay", "--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1"}, tc.args...)
			_, stderr, code := runOnce(t, args...)
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}

	// A bad base URL is named without the credentials it may carry.
	t.Run("OpenAIBaseURLRedacted", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := runOnce(t, append(append([]string{}, base...), "--provider", "openai", "--openai-model", "m",
			"--openai-base-url", "ftp://user:s3cret@models.internal/v1")...)
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "--openai-base-url: ")
		require.NotContains(t, stderr, "s3cret")
	})

	t.Run("BrokerPartitionsZero", func(t *testing.T) {
		t.Parallel()
		_, stderr, code := runOnce(t, "broker", "--addr", "127.0.0.1:0", "--partitions", "0")
		require.Equal(t, 1, code, stderr)
		require.Contains(t, stderr, "--partitions")
	})
}
