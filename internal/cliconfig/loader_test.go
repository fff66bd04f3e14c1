package cliconfig_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/promptline/promptline/internal/cliconfig"
)

// testBundle is a small command tree, the way the consumer builds its
// own: a root with persistent and local flags, and a subcommand whose
// --partitions means something else.
type testBundle struct {
	root        *cobra.Command
	loader      *cliconfig.Loader
	lease       time.Duration
	createTopic bool
	conns       int32
	perms       []string
	endpoints   []string
	brokers     []string
	dbURL       string
	subParts    string
	ran         string
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func setup(t *testing.T, env ...string) *testBundle {
	t.Helper()
	return setupProgram(t, "", env...)
}

// setupProgram is setup with the loader's Config.Program set.
func setupProgram(t *testing.T, program string, env ...string) *testBundle {
	t.Helper()
	b := &testBundle{}
	b.root = &cobra.Command{Use: "app", SilenceErrors: true, SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error { b.ran = "root"; return nil }}
	pf := b.root.PersistentFlags()
	pf.String("config", "", "")
	pf.StringVar(&b.dbURL, "database-url", "", "")
	f := b.root.Flags()
	f.DurationVar(&b.lease, "lease", 30*time.Second, "")
	f.BoolVar(&b.createTopic, "create-topics", true, "")
	f.Int32Var(&b.conns, "db-max-conns", 32, "")
	f.StringArrayVar(&b.perms, "tool-permission", nil, "")
	f.StringArrayVar(&b.endpoints, "http-tool-endpoint", nil, "")
	cliconfig.ItemsPerLine(f, "http-tool-endpoint")
	f.StringSliceVar(&b.brokers, "brokers", nil, "")
	f.Int32("partitions", 16, "")
	sub := &cobra.Command{Use: "sub", RunE: func(*cobra.Command, []string) error { b.ran = "sub"; return nil }}
	sub.Flags().StringVar(&b.subParts, "partitions", "", "")
	cliconfig.CommandLineOnly(sub.Flags(), "partitions")
	b.root.AddCommand(sub)
	b.loader = cliconfig.New(&cliconfig.Config{
		EnvironFunc: func() []string { return env },
		EnvAliases:  map[string]string{"DATABASE_URL": "database-url"},
		IgnoreEnv:   []string{"PROMPTLINE_FAULT"},
		Program:     program,
	})
	b.loader.Install(b.root)
	return b
}

func (b *testBundle) run(args ...string) error {
	b.root.SetArgs(args)
	return b.root.Execute()
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "promptline.yaml")
	require.NoError(t, os.WriteFile(p, []byte(yaml), 0o600))
	return p
}

const fileAll = `
lease: 1m
create-topics: false
db-max-conns: 8
tool-permission: [a=allow, b=ask]
brokers: [f1:9092, f2:9092]
`

func TestLoader(t *testing.T) {
	t.Parallel()

	// A list whose items hold commas takes one item per line from the
	// environment and from a file's scalar; commas would cut each apart.
	t.Run("ItemsPerLine", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "PROMPTLINE_HTTP_TOOL_ENDPOINT=name=a,url=http://x\n name=b,url=http://y,class=idempotent\n\n",
			"PROMPTLINE_TOOL_PERMISSION=c=deny,d=allow")
		require.NoError(t, b.run())
		require.Equal(t, []string{"name=a,url=http://x", "name=b,url=http://y,class=idempotent"}, b.endpoints)
		require.Equal(t, []string{"c=deny", "d=allow"}, b.perms, "other lists stay comma-separated")

		b = setup(t)
		require.NoError(t, b.run("--config", writeConfig(t, "http-tool-endpoint: name=a,url=http://x\n")))
		require.Equal(t, []string{"name=a,url=http://x"}, b.endpoints, "a scalar in the file is one item")
		b = setup(t)
		require.NoError(t, b.run("--config", writeConfig(t, "http-tool-endpoint: [\"name=a,url=http://x\", \"name=b,url=http://y\"]\n")))
		require.Equal(t, []string{"name=a,url=http://x", "name=b,url=http://y"}, b.endpoints, "a YAML list is a list")
	})

	t.Run("Precedence", func(t *testing.T) {
		t.Parallel()
		path := writeConfig(t, fileAll)
		env := []string{"PROMPTLINE_LEASE=2m", "PROMPTLINE_CREATE_TOPICS=true", "PROMPTLINE_TOOL_PERMISSION=c=deny,d=allow", "PROMPTLINE_FAULT="}

		// File over default.
		b := setup(t)
		require.NoError(t, b.run("--config", path))
		require.Equal(t, time.Minute, b.lease)
		require.False(t, b.createTopic)
		require.Equal(t, int32(8), b.conns)
		require.Equal(t, []string{"a=allow", "b=ask"}, b.perms)
		require.Equal(t, []string{"f1:9092", "f2:9092"}, b.brokers)
		src := b.loader.Sources()
		require.Equal(t, "config file "+path, src["lease"].String())
		require.Equal(t, "default", src["partitions"].String())

		// Env over file.
		b = setup(t, env...)
		require.NoError(t, b.run("--config", path))
		require.Equal(t, 2*time.Minute, b.lease)
		require.True(t, b.createTopic)
		require.Equal(t, int32(8), b.conns, "not in the env: the file's")
		require.Equal(t, []string{"c=deny", "d=allow"}, b.perms, "a list replaces, it does not append")
		require.Equal(t, "env PROMPTLINE_LEASE", b.loader.Sources()["lease"].String())

		// Flag over env.
		b = setup(t, env...)
		require.NoError(t, b.run("--config", path, "--lease", "3m", "--create-topics=false", "--tool-permission", "e=ask", "--db-max-conns", "4"))
		require.Equal(t, 3*time.Minute, b.lease)
		require.False(t, b.createTopic)
		require.Equal(t, []string{"e=ask"}, b.perms)
		require.Equal(t, int32(4), b.conns)
		require.Equal(t, "flag", b.loader.Sources()["tool-permission"].String())

		// The config file named by the environment.
		b = setup(t, "PROMPTLINE_CONFIG="+path)
		require.NoError(t, b.run())
		require.Equal(t, int32(8), b.conns)
	})

	// One environment and one file for both programs: the producer's
	// settings are left alone by the consumer, a typo is still refused,
	// and without a program every unknown key is.
	t.Run("SiblingSettings", func(t *testing.T) {
		t.Parallel()
		require.Contains(t, cliconfig.Programs["producer"], "message-id")
		require.NotContains(t, cliconfig.Programs["consumer"], "message-id")
		path := writeConfig(t, "lease: 1m\nmessage-id: m-1\ndelivery: steer\n")
		env := []string{"PROMPTLINE_MESSAGE_ID=m-1", "PROMPTLINE_NO_RESUME=true", "PROMPTLINE_LEASE=2m"}

		b := setupProgram(t, "consumer", env...)
		require.NoError(t, b.run("--config", path))
		require.Equal(t, 2*time.Minute, b.lease, "its own settings are still read")

		b = setupProgram(t, "consumer", append(env, "PROMPTLINE_MESAGE_ID=m-1")...)
		require.ErrorContains(t, b.run(), "environment variable PROMPTLINE_MESAGE_ID: unknown setting")
		b = setupProgram(t, "consumer")
		require.ErrorContains(t, b.run("--config", writeConfig(t, "message-id: m-1\nmesage-id: m-1\n")), `unknown key "mesage-id"`)

		b = setupProgram(t, "", env...)
		require.ErrorContains(t, b.run(), "environment variable PROMPTLINE_MESSAGE_ID, PROMPTLINE_NO_RESUME: unknown setting")
		b = setupProgram(t, "")
		require.ErrorContains(t, b.run("--config", path), `unknown key "delivery", "message-id"`)
	})

	t.Run("DatabaseURLAlias", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "DATABASE_URL=postgres://alias/db")
		require.NoError(t, b.run())
		require.Equal(t, "postgres://alias/db", b.dbURL)
		b = setup(t, "DATABASE_URL=postgres://alias/db", "PROMPTLINE_DATABASE_URL=postgres://prefixed/db")
		require.NoError(t, b.run())
		require.Equal(t, "postgres://prefixed/db", b.dbURL, "the prefixed variable wins")
		require.Equal(t, "env PROMPTLINE_DATABASE_URL", b.loader.Sources()["database-url"].String())
	})

	t.Run("CommandLineOnly", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "PROMPTLINE_PARTITIONS=8")
		require.NoError(t, b.run("sub"))
		require.Equal(t, "sub", b.ran)
		require.Empty(t, b.subParts, "a partition count must not become a partition list")
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			env  []string
			file string
			want string
		}{
			{"UnknownFileKey", nil, "lease: 1m\nno-such-key: 1\n", `unknown key "no-such-key" (keys are the flag names of `},
			{"MisspeltFileKey", nil, "leese: 1m\ndb-max-con: 3\n", `unknown key "db-max-con", "leese" (did you mean "db-max-conns", "lease"? keys are the flag names of `},
			{"NestedFileKey", nil, "sub:\n  partitions: 1\n", `unknown key "sub.partitions"`},
			{"ConfigInFile", nil, "config: other.yaml\n", `unknown key "config"`},
			{"UnknownEnv", []string{"PROMPTLINE_NO_SUCH=1"}, "", "environment variable PROMPTLINE_NO_SUCH: unknown setting"},
			{"UnknownEmptyEnv", []string{"PROMPTLINE_NO_SUCH="}, "", "PROMPTLINE_NO_SUCH"},
			{"InvalidFileInt", nil, "db-max-conns: x\n", `db-max-conns: invalid value "x"`},
			{"InvalidFileDuration", nil, "lease: 30\n", `lease: invalid value "30" (want a duration`},
			{"InvalidFileList", nil, "lease: [1m]\n", `lease: invalid value [1m] (want a duration like 30s or 1m30s, not a list)`},
			{"InvalidEnvBool", []string{"PROMPTLINE_CREATE_TOPICS=maybe"}, "", `environment variable PROMPTLINE_CREATE_TOPICS (--create-topics): invalid value "maybe"`},
			{"InvalidYAML", nil, "lease: [\n", "config file "},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, tc.env...)
				args := []string{}
				if tc.file != "" {
					path := writeConfig(t, tc.file)
					args = append(args, "--config", path)
					require.ErrorContains(t, b.run(args...), "config file "+path, "the message names the file")
					b = setup(t, tc.env...)
				}
				err := b.run(args...)
				require.ErrorContains(t, err, tc.want)
				require.Empty(t, b.ran, "nothing runs")
			})
		}
	})

	t.Run("MissingFile", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.ErrorContains(t, b.run("--config", "/nonexistent/promptline.yaml"), "--config: open /nonexistent/promptline.yaml")
	})

	t.Run("AnnotateNamesSource", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "PROMPTLINE_LEASE=1ms")
		require.NoError(t, b.run())
		err := b.loader.Annotate(errString("--lease: must be at least 300ms, got 1ms"))
		require.EqualError(t, err, "--lease: must be at least 300ms, got 1ms (--lease was set by env PROMPTLINE_LEASE)")
		require.EqualError(t, b.loader.Annotate(errString("--db-max-conns: bad")), "--db-max-conns: bad", "a default needs no note")
	})

	t.Run("EffectiveRedacts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "DATABASE_URL=postgres://app:hunter2@db:5432/promptline?sslmode=verify-full")
		require.NoError(t, b.run("--lease", "45s"))
		settings, err := b.loader.Effective()
		require.NoError(t, err)
		var out bytes.Buffer
		require.NoError(t, cliconfig.WriteYAML(&out, settings))
		require.NotContains(t, out.String(), "hunter2")
		require.Contains(t, out.String(), "database-url:\n  value: postgres://app:****@db:5432/promptline?sslmode=verify-full\n  source: env DATABASE_URL\n")
		require.Contains(t, out.String(), "lease:\n  value: 45s\n  source: flag\n")
		require.Contains(t, out.String(), "tool-permission:\n  value: []\n  source: default\n")
	})
}

type errString string

func (e errString) Error() string { return string(e) }

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:pw@h/db":                "postgres://u:****@h/db",
		"postgres://u@h/db":                   "postgres://u@h/db",
		"postgres://h/db?user=u&password=pw":  "postgres://h/db?user=u&password=****",
		"postgres://u:p/ss@h/db":              "postgres://u:****@h/db",
		"https://h/x?Token=t&sig=s&k=v":       "https://h/x?Token=****&sig=****&k=v",
		"postgres://u:p@ss@h/db":              "postgres://u:****@h/db",
		"host=h user=u password=pw dbname=d":  "host=h user=u password=**** dbname=d",
		"host=h password='p w' dbname=d":      "host=h password=**** dbname=d",
		"https://api.openai.com/v1":           "https://api.openai.com/v1",
		"postgres://h/db?sslmode=disable&a=b": "postgres://h/db?sslmode=disable&a=b",
	} {
		require.Equal(t, want, cliconfig.RedactURL(in), in)
	}
}
