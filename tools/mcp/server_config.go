package mcp

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// serverNamePattern is the rule of a server's name: no underscore and no
// dot, so that SERVER__TOOL and SERVER.TOOL are never ambiguous.
var serverNamePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]{0,31}$`)

// ServerConfig names one MCP server and how to reach it: exactly one of
// Command (stdio) and URL (streamable HTTP).
type ServerConfig struct {
	// Name prefixes the server's tools (NAME__TOOL); it must match
	// ^[a-zA-Z0-9][a-zA-Z0-9-]{0,31}$.
	Name string
	// Command is the program and its arguments, run without a shell; the
	// server speaks MCP on its stdin and stdout.
	Command []string
	// URL is the endpoint of a streamable HTTP server.
	URL string
}

// Validate checks the name and that exactly one transport is set.
func (c *ServerConfig) Validate() error {
	if !serverNamePattern.MatchString(c.Name) {
		return fmt.Errorf("name %q must match %s", c.Name, serverNamePattern)
	}
	switch {
	case len(c.Command) > 0 && c.URL != "":
		return fmt.Errorf("server %s: command and url are exclusive", c.Name)
	case len(c.Command) == 0 && c.URL == "":
		return fmt.Errorf("server %s: command or url is required", c.Name)
	case c.URL != "":
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("server %s: url must be an absolute http or https URL", c.Name)
		}
	}
	return nil
}

// ParseServer reads the --mcp-server form: name=N,command="CMD ARGS" or
// name=N,url=U. The command is split into words as a shell would split
// them on blanks, honouring single and double quotes; no shell runs it.
func ParseServer(v string) (ServerConfig, error) {
	var c ServerConfig
	fields, err := splitFields(v)
	if err != nil {
		return c, err
	}
	for _, kv := range fields {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("want key=value pairs (name, command, url), got %q", kv)
		}
		switch strings.TrimSpace(k) {
		case "name":
			c.Name = val
		case "command":
			words, err := splitWords(unquote(val))
			if err != nil {
				return c, fmt.Errorf("command: %w", err)
			}
			if len(words) == 0 {
				return c, errors.New("command: empty")
			}
			c.Command = words
		case "url":
			c.URL = val
		default:
			return c, fmt.Errorf("unknown key %q (want name, command, url)", k)
		}
	}
	return c, c.Validate()
}

// splitFields splits v on the commas outside quotes; the quotes stay.
func splitFields(v string) ([]string, error) {
	var out []string
	var cur strings.Builder
	var quote rune
	for _, r := range v {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote = r
			cur.WriteRune(r)
		case r == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, v)
	}
	return append(out, cur.String()), nil
}

// unquote removes the quotes around a whole value.
func unquote(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

// splitWords splits s into words on blanks; quotes group blanks into a
// word and are removed.
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
