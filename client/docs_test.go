package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// docsProgram is the Go program of docs/producers.md, the block after its
// marker.
func docsProgram(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/producers.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(doc), "<!-- go-client-program")
	require.True(t, ok, "docs/producers.md has no go-client-program marker")
	_, after, ok = strings.Cut(after, "```go\n")
	require.True(t, ok, "no Go block after the marker")
	program, _, ok := strings.Cut(after, "```")
	require.True(t, ok, "the Go block is not closed")
	return program
}

// TestDocsProgram builds the program docs/producers.md shows Go users in a
// module of its own, as a program outside this module would (require the
// module, a replace directive standing for `go get`, offline from the
// module cache), and runs it against the consumer of this test binary: it
// sends a prompt and prints its turn.completed. Only the broker address
// and the session ID are substituted.
func TestDocsProgram(t *testing.T) {
	t.Parallel()
	program := docsProgram(t)
	require.Contains(t, program, `"127.0.0.1:9092"`)
	require.Contains(t, program, `"s-1"`)
	lines := strings.Count(strings.TrimSpace(program[strings.Index(program, "func main()"):]), "\n") - 1
	t.Logf("the program's main has %d lines", lines)
	program = strings.ReplaceAll(program, `"127.0.0.1:9092"`, `"`+env.brokers+`"`)
	program = strings.ReplaceAll(program, `"s-1"`, `"`+unique("docs")+`"`)

	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o600))
	// The program's module requires what this module requires, at the same
	// versions (what `go get` of the package would write, with `go mod
	// tidy`): with a pruned module graph the build then reads only go.mod
	// files this module's own build has in the module cache. Requiring the
	// package alone, the build walks the full graph and needs the go.mod of
	// every old version there (testify v1.4.0, ...), which a fresh module
	// cache has not got offline.
	ours, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	gomod, ok := strings.CutPrefix(string(ours), "module github.com/promptline/promptline\n")
	require.True(t, ok, "go.mod does not start with the module line")
	gomod = "module example.com/asks\n" + gomod +
		"\nrequire github.com/promptline/promptline v0.0.0\n\nreplace github.com/promptline/promptline => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o600))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o600))

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "asks")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build of the docs' program: %s", out)

	run := exec.CommandContext(ctx, bin)
	var stderr strings.Builder
	run.Stderr = &stderr
	stdout, err := run.Output()
	require.NoError(t, err, "the docs' program: %s", stderr.String())
	require.Equal(t, "turn.completed echo: hello\n", string(stdout))
}
