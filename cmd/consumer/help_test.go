package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestHelpShowsEachFlagsArgument runs the binary's --help for every
// command and checks, for each flag it lists, the placeholder after the
// flag's name: the type of the value it takes (none for a switch). pflag
// takes the first back-quoted word of a usage text for that placeholder,
// so a usage that quotes a command that way makes --help lie about what
// the flag takes (`--migrate consumer migrate` for a boolean).
func TestHelpShowsEachFlagsArgument(t *testing.T) {
	t.Parallel()
	var walk func(path []string, c *cobra.Command)
	walk = func(path []string, c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		// The flags are listed here, before the parallel subtests start:
		// cobra builds a command's inherited flags lazily, by writing into
		// the parents' flag sets, so listing them from parallel subtests
		// races.
		var flags []*pflag.Flag
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				flags = append(flags, f)
			}
		})
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				flags = append(flags, f)
			}
		})
		t.Run(strings.Join(append([]string{"consumer"}, path...), "_"), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runOnce(t, append(append([]string{}, path...), "--help")...)
			require.Equal(t, 0, code, "stderr:\n%s", stderr)
			for _, f := range flags {
				checkHelpFlag(t, stdout, f)
			}
		})
		for _, sub := range c.Commands() {
			walk(append(append([]string{}, path...), sub.Name()), sub)
		}
	}
	walk(nil, newRootCommandEnv(func() []string { return nil }))
}

// checkHelpFlag finds f's line in a --help text and checks what follows
// the flag's name: its value's type, as pflag names it, then the usage.
func checkHelpFlag(t *testing.T, help string, f *pflag.Flag) {
	t.Helper()
	want, _ := pflag.UnquoteUsage(&pflag.Flag{Name: f.Name, Value: f.Value})
	if want != "" {
		want = " " + want
	}
	line := regexp.MustCompile(`(?m)^\s+(-\w, )?--` + regexp.QuoteMeta(f.Name) + `\b.*$`).FindString(help)
	require.NotEmpty(t, line, "--%s is not listed in:\n%s", f.Name, help)
	require.Regexp(t, `--`+regexp.QuoteMeta(f.Name)+regexp.QuoteMeta(want)+`\s{2,}\S`, line,
		"--%s: the placeholder after the name must be its type %q", f.Name, want)
	require.NotContains(t, line, "`", "--%s: a back-quote in a usage text is taken for the placeholder", f.Name)
}

// TestUnknownSubcommandFails runs every command that has subcommands
// with one that does not exist: it must exit 1 naming it, as the root
// does, never print the help and exit 0 (a script's `consumer recovery
// hodl` would otherwise go on as if recovery were held).
func TestUnknownSubcommandFails(t *testing.T) {
	t.Parallel()
	var walk func(path []string, c *cobra.Command)
	walk = func(path []string, c *cobra.Command) {
		if !c.HasSubCommands() {
			return
		}
		t.Run(strings.Join(append([]string{"consumer"}, path...), "_"), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runOnce(t, append(append([]string{}, path...), "no-such-command")...)
			require.Equal(t, 1, code, "stdout:\n%s", stdout)
			require.Contains(t, stderr, `unknown command "no-such-command"`)
		})
		for _, sub := range c.Commands() {
			walk(append(append([]string{}, path...), sub.Name()), sub)
		}
	}
	walk(nil, newRootCommandEnv(func() []string { return nil }))
}
