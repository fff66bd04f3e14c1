package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestREADMEFlagsTable reads the README's "consumer flags" table, the
// contract of the consumer's flags, and checks it against the command:
// every flag of `consumer` is in it, and a default the table states as a
// value is the flag's default.
func TestREADMEFlagsTable(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## consumer flags\n")
	require.True(t, ok, "README has no consumer flags section")
	section, _, _ = strings.Cut(section, "\n## ")

	tick := regexp.MustCompile("`([^`]*)`")
	documented := map[string]string{} // flag -> the default the table states ("" when in words)
	for _, row := range strings.Split(section, "\n") {
		cells := strings.Split(row, " | ")
		if !strings.HasPrefix(row, "| `--") || len(cells) < 3 {
			continue
		}
		var defaults []string
		for _, m := range tick.FindAllStringSubmatch(cells[1], -1) {
			defaults = append(defaults, m[1])
		}
		flags := tick.FindAllStringSubmatch(cells[0], -1)
		for i, m := range flags {
			name := strings.TrimPrefix(m[1], "--")
			switch {
			case len(defaults) == len(flags):
				documented[name] = defaults[i]
			case len(defaults) == 1 && len(flags) == 1:
				documented[name] = defaults[0]
			default:
				documented[name] = ""
			}
		}
	}

	root := newRootCommandEnv(func() []string { return nil })
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		def, ok := documented[f.Name]
		if !assertTrue(t, ok, "--%s is missing from the README's consumer flags table", f.Name) || def == "" ||
			strings.HasPrefix(def, "$") || strings.HasPrefix(def, "--") {
			return
		}
		if f.Value.Type() == "duration" {
			want, err := time.ParseDuration(def)
			require.NoError(t, err, "--%s: README default %q", f.Name, def)
			require.Equal(t, want.String(), f.DefValue, "--%s: README default %q", f.Name, def)
			return
		}
		require.Equal(t, def, f.DefValue, "--%s: README default", f.Name)
	})
}

func assertTrue(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}
