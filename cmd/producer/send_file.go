package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/promptline/promptline/client"
	"github.com/promptline/promptline/envelope"
)

// maxLineBytes bounds a line of a prompts file: the largest value admission
// accepts, plus a CRLF.
const maxLineBytes = 1<<20 + 2

// record is one validated line of a prompts file.
type record struct {
	line   int
	prompt envelope.Prompt
}

// readPrompts reads and validates every line of a JSON Lines file of
// envelopes with envelope.Decode, the rule admission applies, so that a bad
// line stops the run before anything is sent. Blank lines are skipped. A
// message ID reused with another payload is rejected too: admission would
// reject it as a conflict.
func readPrompts(name string, r io.Reader) ([]record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	type seen struct {
		line int
		hash string
	}
	ids := make(map[string]seen)
	var recs []record
	line := 0
	for sc.Scan() {
		line++
		value := bytes.TrimRight(sc.Bytes(), "\r")
		if len(bytes.TrimSpace(value)) == 0 {
			continue
		}
		p, err := envelope.Decode(nil, value, envelope.Limits{})
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		h := string(p.Hash())
		if prev, ok := ids[p.MessageID]; ok && prev.hash != h {
			return nil, fmt.Errorf("%s:%d: %s: message_id %q is used on line %d with another payload",
				name, line, envelope.ReasonConflict, p.MessageID, prev.line)
		} else if !ok {
			ids[p.MessageID] = seen{line: line, hash: h}
		}
		recs = append(recs, record{line: line, prompt: p})
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("%s:%d: %s: line is longer than %d bytes", name, line+1, envelope.ReasonTooLarge, maxLineBytes-2)
	} else if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: no prompts", name)
	}
	return recs, nil
}

func (o *sendOpts) sendFile(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, cfg *client.Config) error {
	name, r := o.file, stdin
	if o.file == "-" {
		name = "stdin"
	} else {
		f, err := os.Open(o.file)
		if err != nil {
			return fmt.Errorf("--file: %w", err)
		}
		defer f.Close()
		r = f
	}
	recs, err := readPrompts(name, r)
	if err != nil {
		return err
	}
	prompts := make([]envelope.Prompt, len(recs))
	for i, rec := range recs {
		prompts[i] = rec.prompt
	}

	producer, err := client.NewProducer(cfg)
	if err != nil {
		return err
	}
	prog := newProgress(stderr, len(recs))
	sent, err := producer.SendBatch(ctx, prompts, &client.SendBatchOpts{ProgressFunc: func(int) { prog.Add(1) }})
	prog.Finish()
	if cerr := producer.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var batch *client.BatchError
	if errors.As(err, &batch) {
		// Name the line, not the position in the batch.
		return fmt.Errorf("sent %d of %d prompts to %s: line %d: %w", sent, len(recs), o.topic, recs[batch.Index].line, batch.Err)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "sent %d prompts to %s\n", sent, o.topic)
	return err
}
