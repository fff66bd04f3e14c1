package cliconfig

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/promptline/promptline/internal/redact"
)

// Redacted replaces a secret in printed configuration.
const Redacted = "****"

// Setting is one flag's effective value and its source.
type Setting struct {
	Name   string
	Value  any // redacted
	Source Source
}

// Effective returns every setting of the command that ran (after Apply),
// secrets redacted, sorted by name.
func (l *Loader) Effective() ([]Setting, error) {
	if l.fs == nil {
		return nil, fmt.Errorf("cliconfig: Effective before Apply")
	}
	// posflag reads the flags' typed values; an empty koanf as its
	// reference makes it take unchanged (default) flags too.
	k := koanf.New(".")
	if err := k.Load(posflag.ProviderWithFlag(l.fs, ".", k, func(f *pflag.Flag) (string, any) {
		if f.Name == "help" {
			return "", nil
		}
		return f.Name, printable(posflag.FlagVal(l.fs, f))
	}), nil); err != nil {
		return nil, err
	}
	var out []Setting
	for _, name := range k.Keys() {
		out = append(out, Setting{Name: name, Value: redactSetting(name, k.Get(name)), Source: l.sources[name]})
	}
	slices.SortFunc(out, func(a, b Setting) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// printable turns durations into their text (YAML would print
// nanoseconds).
func printable(v any) any {
	switch v := v.(type) {
	case time.Duration:
		return v.String()
	case []string:
		if v == nil {
			return []string{}
		}
	}
	return v
}

// WriteYAML prints settings as YAML: per setting its value and source.
func WriteYAML(w io.Writer, settings []Setting) error {
	type entry struct {
		Value  any    `yaml:"value"`
		Source string `yaml:"source"`
	}
	root := &yaml.Node{Kind: yaml.MappingNode}
	for _, s := range settings {
		var v yaml.Node
		if err := v.Encode(entry{Value: s.Value, Source: s.Source.String()}); err != nil {
			return fmt.Errorf("encoding %s: %w", s.Name, err)
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: s.Name}, &v)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return err
	}
	return enc.Close()
}

// secretName matches the names of settings whose value is a secret;
// names ending -file or -env hold where the secret is, not the secret.
var secretName = regexp.MustCompile(`password|token|secret`)

func redactSetting(name string, v any) any {
	if s, ok := v.(string); ok {
		if s != "" && secretName.MatchString(name) && !strings.HasSuffix(name, "-file") && !strings.HasSuffix(name, "-env") {
			return Redacted
		}
		return RedactURL(s)
	}
	if ss, ok := v.([]string); ok {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = RedactURL(s)
		}
		return out
	}
	return v
}

// RedactURL hides the secrets of a URL or a connection string
// (redact.URL: the one function that knows them).
func RedactURL(s string) string { return redact.URL(s) }
