package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/promptline/promptline/internal/cliconfig"
)

// runInProcess runs the consumer's command tree in this process with args
// and its own environment (so the tests stay parallel).
func runInProcess(t *testing.T, env []string, args ...string) (stdout string, err error) {
	t.Helper()
	root := newRootCommandEnv(func() []string { return env })
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = root.ExecuteContext(ctx)
	return out.String(), err
}

type printed map[string]struct {
	Value  any    `yaml:"value"`
	Source string `yaml:"source"`
}

func configPrint(t *testing.T, env []string, args ...string) printed {
	t.Helper()
	out, err := runInProcess(t, env, append([]string{"config", "print"}, args...)...)
	require.NoError(t, err)
	var p printed
	require.NoError(t, yaml.Unmarshal([]byte(out), &p), out)
	return p
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "promptline.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestConfig(t *testing.T) {
	t.Parallel()

	// cliconfig.Programs is how the producer tells the consumer's settings
	// from typos in an environment both share: it must list every flag.
	t.Run("SettingsListed", func(t *testing.T) {
		t.Parallel()
		require.ElementsMatch(t, cliconfig.Settings(newRootCommandEnv(func() []string { return nil })), cliconfig.Programs["consumer"],
			"update cliconfig.Programs[\"consumer\"] with the consumer's flags")
	})

	// One environment for both programs: the producer's settings are left
	// alone, a typo is refused.
	t.Run("SharedEnvironment", func(t *testing.T) {
		t.Parallel()
		p := configPrint(t, []string{"PROMPTLINE_MESSAGE_ID=m-1", "PROMPTLINE_DELIVERY=steer", "PROMPTLINE_GROUP=shared"})
		require.Equal(t, "shared", p["group"].Value)
		_, err := runInProcess(t, []string{"PROMPTLINE_GROUP=shared", "PROMPTLINE_GRUOP=typo"}, "config", "print")
		require.ErrorContains(t, err, "environment variable PROMPTLINE_GRUOP: unknown setting")
	})

	// The tests' broker switch reaches the processes a test starts; it is
	// not a setting, so it must not stop them (make test/kafka).
	t.Run("TestBrokerSwitchIsNotASetting", func(t *testing.T) {
		t.Parallel()
		p := configPrint(t, []string{"PROMPTLINE_TEST_KAFKA=apache", "PROMPTLINE_TEST_KAFKA_JVMS=2", "PROMPTLINE_GROUP=g"})
		require.Equal(t, "g", p["group"].Value)
	})

	t.Run("Precedence", func(t *testing.T) {
		t.Parallel()
		file := writeConfig(t, `
lease: 45s
create-topics: false
tool-permission: [shell=deny, append_line=ask]
db-max-conns: 16
group: from-file
replication-factor: 3
`)
		env := []string{"PROMPTLINE_LEASE=50s", "PROMPTLINE_TOOL_PERMISSION=shell=ask", "PROMPTLINE_GROUP=from-env", "PROMPTLINE_FAULT="}
		p := configPrint(t, env, "--config", file, "--group", "from-flag", "--create-topics=true")

		require.Equal(t, "from-flag", p["group"].Value, "flag beats env and file")
		require.Equal(t, "flag", p["group"].Source)
		require.Equal(t, true, p["create-topics"].Value, "a bool flag beats the file")
		require.Equal(t, "50s", p["lease"].Value, "env beats file (a duration)")
		require.Equal(t, "env PROMPTLINE_LEASE", p["lease"].Source)
		require.Equal(t, []any{"shell=ask"}, p["tool-permission"].Value, "env beats file (a repeated flag)")
		require.Equal(t, 16, p["db-max-conns"].Value, "file beats default")
		require.Equal(t, "config file "+file, p["db-max-conns"].Source)
		require.Equal(t, 3, p["replication-factor"].Value)
		require.Equal(t, "10s", p["recovery-interval"].Value, "the default")
		require.Equal(t, "default", p["recovery-interval"].Source)

		// Without the env, the file's list stands, as a list.
		p = configPrint(t, nil, "--config", file)
		require.Equal(t, []any{"shell=deny", "append_line=ask"}, p["tool-permission"].Value)
		require.Equal(t, false, p["create-topics"].Value)
		require.Equal(t, "45s", p["lease"].Value)
	})

	// print checks the settings as the consumer does, after printing them:
	// a command line the consumer would refuse is refused here too.
	t.Run("PrintChecksTheSettings", func(t *testing.T) {
		t.Parallel()
		out, err := runInProcess(t, nil, "config", "print", "--lease", "1ms")
		require.ErrorContains(t, err, "--lease")
		require.Contains(t, out, "lease:", "the settings are printed all the same")
		_, err = runInProcess(t, nil, "config", "print", "--rejects-topic", "prompts")
		require.ErrorContains(t, err, `--rejects-topic: "prompts" is also --prompts-topic`)
	})

	t.Run("PrintRedactsDatabasePassword", func(t *testing.T) {
		t.Parallel()
		passFile := filepath.Join(t.TempDir(), "kafka-password")
		require.NoError(t, os.WriteFile(passFile, []byte("s3cret-in-file"), 0o600))
		out, err := runInProcess(t, nil, "config", "print",
			"--database-url", "postgres://app:hunter2@db.internal:5432/promptline?sslmode=verify-full",
			"--brokers", "kafka.internal:9092", "--sasl-mechanism", "PLAIN", "--sasl-user", "app",
			"--sasl-password-file", passFile)
		require.NoError(t, err)
		require.NotContains(t, out, "hunter2")
		require.Contains(t, out, "postgres://app:****@db.internal:5432/promptline?sslmode=verify-full")
		require.Contains(t, out, passFile, "a secret's file is shown as a path")
		require.NotContains(t, out, "s3cret-in-file", "its contents never")
	})

	// A password with an unescaped '/' is not a URL net/url parses; it is
	// masked all the same, and so are the query secrets of every URL
	// printed (a flag value holding one included).
	t.Run("PrintRedactsUnparsableURLsAndQuerySecrets", func(t *testing.T) {
		t.Parallel()
		out, err := runInProcess(t, nil, "config", "print",
			"--database-url", "postgres://app:pa/ss@db.internal:5432/promptline",
			"--provider-url", "https://model.internal/v1/step?api_key=k3y",
			"--http-tool-endpoint", "name=hook,url=https://u:pw0rd@hooks.internal/x?token=t0ken&sig=s1g")
		require.NoError(t, err)
		for _, secret := range []string{"pa/ss", "k3y", "pw0rd", "t0ken", "s1g"} {
			require.NotContains(t, out, secret)
		}
		require.Contains(t, out, "postgres://app:****@db.internal:5432/promptline")
		require.Contains(t, out, "https://model.internal/v1/step?api_key=****")
	})

	t.Run("DatabaseURLFromEnv", func(t *testing.T) {
		t.Parallel()
		p := configPrint(t, []string{"DATABASE_URL=postgres://old:pw1@h/db", "PROMPTLINE_DATABASE_URL=postgres://new:pw2@h/db"})
		require.Equal(t, "postgres://new:****@h/db", p["database-url"].Value, "PROMPTLINE_DATABASE_URL wins over DATABASE_URL")
		require.Equal(t, "env PROMPTLINE_DATABASE_URL", p["database-url"].Source)
		p = configPrint(t, []string{"DATABASE_URL=postgres://old:pw1@h/db"})
		require.Equal(t, "env DATABASE_URL", p["database-url"].Source)
	})

	// Each bad setting stops the consumer before it connects to anything,
	// naming the key (or the variable) and where it came from.
	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			env  []string
			file string
			want []string
		}{
			{"UnknownFileKey", nil, "db-max-conns: 8\nmax-conns: 8\n", []string{"config file ", `unknown key "max-conns"`}},
			{"UnknownEnv", []string{"PROMPTLINE_MAX_CONNS=8"}, "", []string{"environment variable PROMPTLINE_MAX_CONNS: unknown setting"}},
			{"InvalidFileValue", nil, "db-max-conns: x\n", []string{"config file ", `db-max-conns: invalid value "x"`}},
			{"InvalidEnvValue", []string{"PROMPTLINE_LEASE=soon"}, "", []string{"environment variable PROMPTLINE_LEASE (--lease): invalid value \"soon\""}},
			// The flag validation still names the flag, and now the source.
			{"ValidationFromEnv", []string{"PROMPTLINE_PARTITIONS=0"}, "", []string{"--partitions: must be at least 1, got 0", "set by env PROMPTLINE_PARTITIONS"}},
			{"ValidationFromFile", nil, "lease: 1ms\n", []string{"--lease: must be at least 300ms", "set by config file "}},
			{"BufferBytesFromEnv", []string{"PROMPTLINE_BUFFER_BYTES=0"}, "", []string{"--buffer-bytes: must be at least 1, got 0", "set by env PROMPTLINE_BUFFER_BYTES"}},
			{"ValidationFromFlag", nil, "", []string{"--max-sessions: must be at least 1"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				args := []string{"--brokers", "127.0.0.1:1", "--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1", "--metrics-addr", "127.0.0.1:0"}
				if tc.file != "" {
					args = append(args, "--config", writeConfig(t, tc.file))
				}
				if tc.name == "ValidationFromFlag" {
					args = append(args, "--max-sessions", "0")
				}
				_, err := runInProcess(t, tc.env, args...)
				require.Error(t, err)
				for _, w := range tc.want {
					require.ErrorContains(t, err, w)
				}
			})
		}
	})

	// The key is replay's too: its --buffer-bytes, the same per partition.
	t.Run("ReplayBufferBytesFromEnv", func(t *testing.T) {
		t.Parallel()
		_, err := runInProcess(t, []string{"PROMPTLINE_BUFFER_BYTES=0"}, "replay", "--brokers", "127.0.0.1:1",
			"--database-url", "postgres://127.0.0.1:1/none?connect_timeout=1")
		require.ErrorContains(t, err, "--buffer-bytes: must be at least 1, got 0")
		require.ErrorContains(t, err, "set by env PROMPTLINE_BUFFER_BYTES")
	})

	// The binary reads its real environment: an unknown variable stops it.
	t.Run("ProcessUnknownEnv", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, consumerBin, "--brokers", "127.0.0.1:1")
		cmd.Args[0] = "consumer"
		cmd.Env = append(os.Environ(), "PROMPTLINE_FAULT=", "PROMPTLINE_GRUOP=typo")
		out, err := cmd.CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "consumer: environment variable PROMPTLINE_GRUOP: unknown setting")
	})
}
