package tools_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/tools"
)

func appendInput(t *testing.T, file, line string) json.RawMessage {
	t.Helper()
	in, err := json.Marshal(map[string]string{"file": file, "line": line})
	require.NoError(t, err)
	return in
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, len(data) == 0 || data[len(data)-1] == '\n', "file ends mid-line")
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func TestAppendLine(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		dir  string
		tool tools.Tool
		reg  *tools.Registry
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		// The sandbox is a subdirectory, so that an escape into its parent
		// is visible.
		dir := filepath.Join(t.TempDir(), "sandbox")
		require.NoError(t, os.Mkdir(dir, 0o755))
		tool := tools.NewAppendLine(dir)
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tool))
		return &testBundle{dir: dir, tool: tool, reg: reg}
	}
	ctx := context.Background()

	t.Run("Spec", func(t *testing.T) {
		t.Parallel()
		spec := setup(t).tool.Spec()
		require.Equal(t, "append_line", spec.Name)
		require.Equal(t, tools.SideEffecting, spec.Class)
	})

	t.Run("OneLinePerRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i, line := range []string{"first", "", "third line ünï"} {
			in := appendInput(t, "log.txt", line)
			require.NoError(t, b.reg.Validate("append_line", in))
			res, err := b.tool.Run(ctx, tools.Call{Name: "append_line", Input: in})
			require.NoError(t, err)
			require.Equal(t, tools.Result{Output: "appended"}, res)
			require.Len(t, readLines(t, filepath.Join(b.dir, "log.txt")), i+1)
		}
		require.Equal(t, []string{"first", "", "third line ünï"}, readLines(t, filepath.Join(b.dir, "log.txt")))
	})

	t.Run("RejectsEscapes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, tc := range []struct{ file, line string }{
			{"../x", "l"},
			{"/etc/passwd", "l"},
			{"a/b", "l"},
			{`a\b`, "l"},
			{".hidden", "l"},
			{"..", "l"},
			{".", "l"},
			{"", "l"},
			{"x\x00", "l"},
			{strings.Repeat("f", 129), "l"},
			{"ok.txt", "two\nlines"},
			{"ok.txt", "carriage\rreturn"},
			{"ok.txt", "trailing\n"},
		} {
			in := appendInput(t, tc.file, tc.line)
			var ie *tools.InputError
			require.ErrorAs(t, b.reg.Validate("append_line", in), &ie, "%q %q", tc.file, tc.line)

			// Run refuses too, for a caller that did not validate.
			res, err := b.tool.Run(ctx, tools.Call{Name: "append_line", Input: in})
			require.NoError(t, err)
			require.True(t, res.IsError, "%q %q", tc.file, tc.line)
		}
		entries, err := os.ReadDir(b.dir)
		require.NoError(t, err)
		require.Empty(t, entries)
		_, err = os.Stat(filepath.Join(filepath.Dir(b.dir), "x"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})

	t.Run("LongestLine", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "f", strings.Repeat("x", 64<<10))})
		require.NoError(t, err)
		require.False(t, res.IsError)
		res, err = b.tool.Run(ctx, tools.Call{Input: appendInput(t, "f", strings.Repeat("x", 64<<10+1))})
		require.NoError(t, err)
		require.True(t, res.IsError)
		require.Len(t, readLines(t, filepath.Join(b.dir, "f")), 1)
	})

	t.Run("SymlinkCannotEscape", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		outside := filepath.Join(filepath.Dir(b.dir), "outside.txt")
		require.NoError(t, os.WriteFile(outside, []byte("keep\n"), 0o644))
		require.NoError(t, os.Symlink(outside, filepath.Join(b.dir, "link")))
		_, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "link", "escaped")})
		require.ErrorIs(t, err, tools.ErrNotRun)
		data, err := os.ReadFile(outside)
		require.NoError(t, err)
		require.Equal(t, "keep\n", string(data))
	})

	t.Run("HardLinkCannotEscape", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		outside := filepath.Join(filepath.Dir(b.dir), "outside.txt")
		require.NoError(t, os.WriteFile(outside, []byte("keep\n"), 0o644))
		require.NoError(t, os.Link(outside, filepath.Join(b.dir, "link")))
		_, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "link", "escaped")})
		require.ErrorIs(t, err, tools.ErrNotRun)
		require.ErrorContains(t, err, "link")
		data, err := os.ReadFile(outside)
		require.NoError(t, err)
		require.Equal(t, "keep\n", string(data))
	})

	t.Run("FIFODoesNotBlock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, syscall.Mkfifo(filepath.Join(b.dir, "fifo"), 0o644))
		// With and without a reader on the other end: neither blocks,
		// neither writes.
		type outcome struct{ err error }
		run := func() error {
			got := make(chan outcome, 1)
			go func() {
				_, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "fifo", "into a pipe")})
				got <- outcome{err}
			}()
			select {
			case o := <-got:
				return o.err
			case <-time.After(10 * time.Second):
				// Unblock the stuck open, so that the test ends.
				r, err := os.OpenFile(filepath.Join(b.dir, "fifo"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
				if err == nil {
					defer r.Close()
				}
				<-got
				t.Fatal("append_line blocked on a FIFO")
				return nil
			}
		}
		require.ErrorIs(t, run(), tools.ErrNotRun)
		r, err := os.OpenFile(filepath.Join(b.dir, "fifo"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		require.NoError(t, err)
		defer r.Close()
		require.ErrorIs(t, run(), tools.ErrNotRun)
		buf := make([]byte, 64)
		n, _ := r.Read(buf)
		require.Zero(t, n, "the line went into the pipe")
	})

	t.Run("DirectoryRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, os.Mkdir(filepath.Join(b.dir, "sub"), 0o755))
		_, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "sub", "l")})
		require.ErrorIs(t, err, tools.ErrNotRun)
	})

	t.Run("MissingSandboxNotRun", func(t *testing.T) {
		t.Parallel()
		tool := tools.NewAppendLine(filepath.Join(t.TempDir(), "missing"))
		_, err := tool.Run(ctx, tools.Call{Input: appendInput(t, "f", "l")})
		require.ErrorIs(t, err, tools.ErrNotRun)
	})

	t.Run("CanceledNotRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := b.tool.Run(cctx, tools.Call{Input: appendInput(t, "f", "l")})
		require.ErrorIs(t, err, tools.ErrNotRun)
		require.ErrorIs(t, err, context.Canceled)
		_, err = os.Stat(filepath.Join(b.dir, "f"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})

	t.Run("ConcurrentRunsWholeLines", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const workers, perWorker = 16, 25
		var wg sync.WaitGroup
		errs := make(chan error, workers*perWorker)
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					// Long lines, so that an interleaving would show.
					line := fmt.Sprintf("w%02d-i%02d-%s", w, i, strings.Repeat(string(rune('a'+w)), 8<<10))
					res, err := b.tool.Run(ctx, tools.Call{Input: appendInput(t, "shared.log", line)})
					if err == nil && res.IsError {
						err = fmt.Errorf("refused: %s", res.Output)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}

		lines := readLines(t, filepath.Join(b.dir, "shared.log"))
		require.Len(t, lines, workers*perWorker)
		seen := map[string]bool{}
		for _, line := range lines {
			var w, i int
			_, err := fmt.Sscanf(line, "w%02d-i%02d-", &w, &i)
			require.NoError(t, err, "line starts %q", line[:min(len(line), 20)])
			require.Equal(t, fmt.Sprintf("w%02d-i%02d-%s", w, i, strings.Repeat(string(rune('a'+w)), 8<<10)), line)
			require.False(t, seen[line[:8]], "line %s twice", line[:8])
			seen[line[:8]] = true
		}
	})
}
