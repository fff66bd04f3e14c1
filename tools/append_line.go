package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
)

// maxLineBytes bounds one appended line, so that it is one write call.
const maxLineBytes = 64 << 10

// fileNamePattern admits a plain file name: no separator, no "..", not
// hidden.
var fileNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,127}$`)

const appendLineSchema = `{
  "type": "object",
  "properties": {
    "file": {
      "type": "string",
      "pattern": "^[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,127}$",
      "description": "A plain file name in the sandbox directory: letters, digits, '.', '_', '-', not starting with '.'."
    },
    "line": {
      "type": "string",
      "pattern": "^[^\\n\\r]*$",
      "maxLength": 65536,
      "description": "One line of text, without line breaks."
    }
  },
  "required": ["file", "line"],
  "additionalProperties": false
}`

type appendLine struct{ dir string }

// NewAppendLine returns the append_line tool, for demos and tests: tests
// count lines to detect a call that ran twice. Name "append_line", class
// SideEffecting. Input {"file": string, "line": string}, both required, no
// other properties.
//
// It appends the line and a '\n' to the named file inside dir, creating the
// file if needed, in one write call on a file opened with O_APPEND (so
// concurrent calls, even from several processes, do not interleave on a
// local file system), and syncs the file before it returns "appended".
//
// dir is a sandbox. The file must be a plain name matching
// ^[a-zA-Z0-9._-]{1,128}$ and not starting with '.': no absolute path, no
// "..", no separator. The file is opened through an os.Root on dir, so a
// symbolic link cannot lead out of it either; it is opened without
// blocking (a FIFO cannot hang the call) and written only when the opened
// descriptor is a regular file with a single link (a hard link planted in
// the sandbox cannot lead out of it). The line must not contain
// '\n' or '\r' and is at most 64 KiB. A refused input is a Result with
// IsError, and nothing is written.
func NewAppendLine(dir string) Tool { return appendLine{dir: dir} }

func (appendLine) Spec() Spec {
	return Spec{
		Name:        "append_line",
		Description: "Appends one line of text to a file in the sandbox directory.",
		InputSchema: json.RawMessage(appendLineSchema),
		Class:       SideEffecting,
	}
}

func (a appendLine) Run(ctx context.Context, call Call) (Result, error) {
	var in struct {
		File *string `json:"file"`
		Line *string `json:"line"`
	}
	if err := json.Unmarshal(call.Input, &in); err != nil || in.File == nil || in.Line == nil {
		return refuse(`invalid input: want {"file": string, "line": string}`), nil
	}
	switch {
	case !fileNamePattern.MatchString(*in.File):
		return refuse(fmt.Sprintf("invalid file %q: want a plain name matching %s", bound(*in.File, 256), fileNamePattern)), nil
	case strings.ContainsAny(*in.Line, "\n\r"):
		return refuse("invalid line: it must not contain a line break"), nil
	case len(*in.Line) > maxLineBytes:
		return refuse(fmt.Sprintf("invalid line: longer than %d bytes", maxLineBytes)), nil
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("append_line: %w: %w", ErrNotRun, err)
	}

	root, err := os.OpenRoot(a.dir)
	if err != nil {
		return Result{}, fmt.Errorf("append_line: opening sandbox: %w: %w", ErrNotRun, err)
	}
	defer root.Close()
	// O_NONBLOCK: a FIFO (or a device) planted in the sandbox must not
	// block the open; the check below then refuses it. On a regular file
	// the flag changes nothing.
	f, err := root.OpenFile(*in.File, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	if err != nil {
		return Result{}, fmt.Errorf("append_line: opening %s: %w: %w", *in.File, ErrNotRun, err)
	}
	if err := checkPlainFile(f); err != nil {
		f.Close()
		return Result{}, fmt.Errorf("append_line: %s: %w: %w", *in.File, ErrNotRun, err)
	}
	// From the write on, a failure leaves the outcome unclear: no ErrNotRun.
	if _, err := f.Write([]byte(*in.Line + "\n")); err != nil {
		f.Close()
		return Result{}, fmt.Errorf("append_line: writing %s: %w", *in.File, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return Result{}, fmt.Errorf("append_line: syncing %s: %w", *in.File, err)
	}
	if err := f.Close(); err != nil {
		return Result{}, fmt.Errorf("append_line: closing %s: %w", *in.File, err)
	}
	return Result{Output: "appended"}, nil
}

// checkPlainFile accepts only a regular file with one link, asked of the
// opened descriptor (not of the path, which could change in between): a
// hard link planted in the sandbox names a file that lives elsewhere too,
// and writing it would write outside the sandbox.
func checkPlainFile(f *os.File) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return errors.New("not a regular file")
	case st.Nlink != 1:
		return fmt.Errorf("the file has %d hard links; only a file with one link is written", st.Nlink)
	}
	return nil
}

func refuse(reason string) Result { return Result{IsError: true, Output: reason} }
