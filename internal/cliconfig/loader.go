package cliconfig

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// annotationCommandLineOnly marks a flag never read from the environment
// or the file.
const annotationCommandLineOnly = "cliconfig/command-line-only"

// CommandLineOnly marks the flag name of fs as read from the command line
// only: for a flag whose name a flag of another command uses with another
// meaning (replay's --partitions is a list of partitions, the consumer's a
// partition count), so that a shared key cannot reach it.
func CommandLineOnly(fs *pflag.FlagSet, name string) {
	if err := fs.SetAnnotation(name, annotationCommandLineOnly, []string{"true"}); err != nil {
		panic(err) // a programming error: no such flag
	}
}

// annotationItemsPerLine marks a list flag whose items hold commas.
const annotationItemsPerLine = "cliconfig/items-per-line"

// ItemsPerLine marks the list flag name of fs as taking one item per line
// from the environment and from a config file's scalar, not a
// comma-separated list: for a flag whose items hold commas themselves
// (--http-tool-endpoint name=N,url=U), which a comma would cut apart. A
// YAML list is a list either way.
func ItemsPerLine(fs *pflag.FlagSet, name string) {
	if err := fs.SetAnnotation(name, annotationItemsPerLine, []string{"true"}); err != nil {
		panic(err) // a programming error: no such flag
	}
}

// Source says where a setting's value came from.
type Source struct {
	// Kind is one of "default", "file", "env", "flag".
	Kind string
	// Name is the file's path (file) or the variable's name (env).
	Name string
}

func (s Source) String() string {
	switch s.Kind {
	case "file":
		return "config file " + s.Name
	case "env":
		return "env " + s.Name
	}
	return s.Kind
}

// Config configures a Loader.
type Config struct {
	// EnvPrefix starts the environment variable of every flag. Defaults to
	// "PROMPTLINE_".
	EnvPrefix string
	// EnvironFunc lists the environment as KEY=value strings, so that tests
	// can pass their own and run in parallel. Defaults to os.Environ.
	EnvironFunc func() []string
	// EnvAliases maps unprefixed environment variables onto flag names,
	// read below the prefixed variable and above the file (DATABASE_URL
	// for --database-url). Defaults to none.
	EnvAliases map[string]string
	// IgnoreEnv lists prefixed variables that are not settings (the fault
	// injection point, PROMPTLINE_FAULT). Defaults to none.
	IgnoreEnv []string
	// ConfigFlag names the flag that names the config file; its variable
	// (PROMPTLINE_CONFIG) names it too. Defaults to "config".
	ConfigFlag string
	// Program names this program in Programs: a variable or a file key
	// that is a setting of another program there is left alone instead
	// of refused. Empty: every unknown key is refused.
	Program string
}

// Loader applies the environment and the config file to a command tree's
// flags and remembers where each value came from.
type Loader struct {
	cfg     Config
	sources map[string]Source // by flag name, for the command that ran
	fs      *pflag.FlagSet    // the flags of the command that ran
}

// New returns a Loader.
func New(cfg *Config) *Loader {
	c := *cfg
	c.EnvPrefix = cmp.Or(c.EnvPrefix, "PROMPTLINE_")
	if c.EnvironFunc == nil {
		c.EnvironFunc = os.Environ
	}
	c.ConfigFlag = cmp.Or(c.ConfigFlag, "config")
	return &Loader{cfg: c}
}

// EnvName is the environment variable of a flag.
func (l *Loader) EnvName(flag string) string {
	return l.cfg.EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Install makes root's tree read its settings through l: before any
// command runs, its flags not given on the command line are set from the
// environment and the file; errors of every command that name a flag set
// that way are completed with the source.
func (l *Loader) Install(root *cobra.Command) {
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return l.Apply(root, cmd) }
	var wrap func(c *cobra.Command)
	wrap = func(c *cobra.Command) {
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error { return l.Annotate(run(cmd, args)) }
		}
		for _, sub := range c.Commands() {
			wrap(sub)
		}
	}
	wrap(root)
}

// knownKeys lists the flag names of every command of the tree.
func knownKeys(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	delete(known, "help")
	return known
}

// Apply sets the flags of cmd (a command of root's tree, its flags parsed)
// that the command line did not give from the environment, else from the
// config file.
func (l *Loader) Apply(root, cmd *cobra.Command) error {
	known := knownKeys(root)
	sibling := siblingSettings(l.cfg.Program)
	environ := l.cfg.EnvironFunc()

	// The environment, through koanf: names are recorded as seen, so that
	// an unknown variable is reported whatever its value.
	envVar := map[string]string{} // key → variable
	var unknown []string
	ke := koanf.New(".")
	if err := ke.Load(env.Provider(".", env.Opt{
		Prefix:      l.cfg.EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(k, v string) (string, any) {
			if slices.Contains(l.cfg.IgnoreEnv, k) {
				return "", nil
			}
			key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, l.cfg.EnvPrefix), "_", "-"))
			if !known[key] || strings.Contains(key, ".") {
				if !sibling[key] {
					unknown = append(unknown, k)
				}
				return "", nil
			}
			if v == "" {
				return "", nil // set but empty: unset (as orchestrators often render optional values)
			}
			envVar[key] = k
			return key, v
		},
	}), nil); err != nil {
		return fmt.Errorf("reading the environment: %w", err)
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return fmt.Errorf("environment variable %s: unknown setting (no flag of that name; variables starting %s are settings)",
			strings.Join(unknown, ", "), l.cfg.EnvPrefix)
	}
	aliasVar := map[string]string{}
	ka := koanf.New(".")
	if len(l.cfg.EnvAliases) > 0 {
		if err := ka.Load(env.Provider(".", env.Opt{
			EnvironFunc: func() []string { return environ },
			TransformFunc: func(k, v string) (string, any) {
				key, ok := l.cfg.EnvAliases[k]
				if !ok || v == "" {
					return "", nil
				}
				aliasVar[key] = k
				return key, v
			},
		}), nil); err != nil {
			return fmt.Errorf("reading the environment: %w", err)
		}
	}

	// The config file: named by the flag, else by its variable.
	path, pathFrom := "", ""
	if f := cmd.Flags().Lookup(l.cfg.ConfigFlag); f != nil && f.Changed {
		path, pathFrom = f.Value.String(), "--"+l.cfg.ConfigFlag
	} else if ke.Exists(l.cfg.ConfigFlag) {
		path, pathFrom = ke.String(l.cfg.ConfigFlag), envVar[l.cfg.ConfigFlag]
		if f != nil {
			if err := f.Value.Set(path); err != nil {
				return err
			}
		}
	}
	kf := koanf.New(".")
	if path != "" {
		if err := kf.Load(file.Provider(path), yaml.Parser()); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				return fmt.Errorf("%s: %w", pathFrom, err)
			}
			return fmt.Errorf("config file %s: %w", path, err)
		}
		var bad, near []string
		for _, key := range kf.Keys() {
			if (!known[key] && !sibling[key]) || key == l.cfg.ConfigFlag {
				bad = append(bad, strconv.Quote(key))
				if k := nearestKey(key, known, l.cfg.ConfigFlag); k != "" {
					near = append(near, strconv.Quote(k))
				}
			}
		}
		if len(bad) > 0 {
			hint := "keys are the flag names of " + root.Name() + " and its commands"
			if len(near) > 0 {
				hint = "did you mean " + strings.Join(near, ", ") + "? " + hint
			}
			return fmt.Errorf("config file %s: unknown key %s (%s)", path, strings.Join(bad, ", "), hint)
		}
	}

	l.fs = cmd.Flags()
	l.sources = map[string]Source{}
	var err error
	l.fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Name == "help" {
			return
		}
		src := Source{Kind: "default"}
		switch {
		case f.Changed:
			src = Source{Kind: "flag"}
		case f.Name == l.cfg.ConfigFlag:
			if path != "" {
				src = Source{Kind: "env", Name: pathFrom}
			}
		case f.Annotations[annotationCommandLineOnly] != nil:
		case ke.Exists(f.Name):
			src = Source{Kind: "env", Name: envVar[f.Name]}
			err = setFromEnv(f, ke.String(f.Name), fmt.Sprintf("environment variable %s (--%s)", src.Name, f.Name))
		case ka.Exists(f.Name):
			src = Source{Kind: "env", Name: aliasVar[f.Name]}
			err = setFromEnv(f, ka.String(f.Name), fmt.Sprintf("environment variable %s (--%s)", src.Name, f.Name))
		case kf.Exists(f.Name):
			src = Source{Kind: "file", Name: path}
			err = setFromFile(f, kf.Get(f.Name), fmt.Sprintf("config file %s: %s", path, f.Name))
		}
		l.sources[f.Name] = src
	})
	return err
}

// setFromEnv sets f from an environment value; a list flag takes a
// comma-separated list, or one item per line (ItemsPerLine).
func setFromEnv(f *pflag.Flag, v, where string) error {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return set(f, splitItems(f, v), true, where, v)
	}
	return set(f, []string{v}, false, where, v)
}

// splitItems splits a list flag's value from the environment or a file's
// scalar: by lines for a flag marked ItemsPerLine, else by commas.
func splitItems(f *pflag.Flag, v string) []string {
	if f.Annotations[annotationItemsPerLine] == nil {
		return splitList(v)
	}
	out := []string{}
	for e := range strings.Lines(v) {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// setFromFile sets f from a YAML value: a scalar, or a list for a list flag.
func setFromFile(f *pflag.Flag, v any, where string) error {
	switch v := v.(type) {
	case []any:
		vals := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := scalar(e)
			if !ok {
				return fmt.Errorf("%s: invalid value: a list of scalars is expected, got %v", where, v)
			}
			vals = append(vals, s)
		}
		if _, ok := f.Value.(pflag.SliceValue); !ok {
			return fmt.Errorf("%s: invalid value %v (want %s, not a list)", where, v, typeName(f))
		}
		return set(f, vals, true, where, fmt.Sprint(v))
	default:
		s, ok := scalar(v)
		if !ok {
			return fmt.Errorf("%s: invalid value %v (want %s)", where, v, typeName(f))
		}
		if _, ok := f.Value.(pflag.SliceValue); ok {
			return set(f, splitItems(f, s), true, where, s)
		}
		return set(f, []string{s}, false, where, s)
	}
}

func set(f *pflag.Flag, vals []string, list bool, where, raw string) error {
	var err error
	if list {
		err = f.Value.(pflag.SliceValue).Replace(vals)
	} else {
		err = f.Value.Set(vals[0])
	}
	if err != nil {
		return fmt.Errorf("%s: invalid value %q (want %s)", where, raw, typeName(f))
	}
	f.Changed = true // the value was given, if not on the command line
	return nil
}

func typeName(f *pflag.Flag) string {
	switch t := f.Value.Type(); t {
	case "duration":
		return "a duration like 30s or 1m30s"
	case "bool":
		return "true or false"
	case "stringSlice", "stringArray":
		return "a list of strings"
	case "int", "int16", "int32", "int64":
		return "an integer"
	case "float64":
		return "a number"
	default:
		return "a " + t
	}
}

func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case nil:
		return "", true
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case time.Time:
		return v.Format(time.RFC3339Nano), true
	}
	return "", false
}

func splitList(s string) []string {
	out := []string{}
	for e := range strings.SplitSeq(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Sources returns where each flag of the command that ran got its value.
func (l *Loader) Sources() map[string]Source { return maps.Clone(l.sources) }

var flagInError = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// Annotate completes an error that names a flag (validation errors name
// the flag, "--lease: must be at least 300ms") with where its value came
// from when that was not the command line: the operator looks there.
func (l *Loader) Annotate(err error) error {
	if err == nil || l.sources == nil {
		return err
	}
	m := flagInError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	src, ok := l.sources[m[1]]
	if !ok || (src.Kind != "env" && src.Kind != "file") {
		return err
	}
	return fmt.Errorf("%w (--%s was set by %s)", err, m[1], src)
}

// nearestKey is the known key (not the config flag's) closest to key, if
// one is at most two edits away (ties: the first in byte order), else "".
// Written here: cobra's own distance function is not exported, and a
// library for twenty lines would be the larger dependency.
func nearestKey(key string, known map[string]bool, configFlag string) string {
	best, bestDist := "", 3
	for k := range known {
		if k == configFlag {
			continue
		}
		if d := editDistance(key, k); d < bestDist || (d == bestDist && k < best) {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
