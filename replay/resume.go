package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ResumeState is what a resume file holds: the topic and, per partition,
// the next offset to replay and the end of the range.
type ResumeState struct {
	Topic  string  `json:"topic"`
	Ranges []Range `json:"ranges"`
}

// LoadResume reads a resume file; ok is false when it does not exist.
func LoadResume(path string) (st ResumeState, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("reading resume file: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("resume file %s: %w", path, err)
	}
	if st.Topic == "" {
		return st, false, fmt.Errorf("resume file %s names no topic", path)
	}
	return st, true, nil
}

// SaveResume writes a resume file atomically (temporary file, rename), so
// that an interruption while writing leaves the previous state.
func SaveResume(path string, st ResumeState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".replay-resume-*")
	if err != nil {
		return fmt.Errorf("writing resume file: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing resume file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing resume file: %w", err)
	}
	return nil
}
