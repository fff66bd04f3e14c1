package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
)

// maxLineBytes bounds a line of a prompts file: the largest value admission
// accepts, plus a CRLF.
const maxLineBytes = 1<<20 + 2

// record is one validated line of a prompts file, published as written.
type record struct {
	line  int
	key   string
	value []byte
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
		recs = append(recs, record{line: line, key: p.SessionID, value: bytes.Clone(value)})
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

func (o *sendOpts) sendFile(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, brokers []string, cfg *sarama.Config) error {
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

	producer, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", strings.Join(brokers, ","), o.kafka.security.Explain(err))
	}
	prog := newProgress(stderr, len(recs))
	sent, err := publish(ctx, producer, o.topic, recs, prog)
	prog.Finish()
	if cerr := producer.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing the producer: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("sent %d of %d prompts to %s: %w", sent, len(recs), o.topic, err)
	}
	_, err = fmt.Fprintf(stdout, "sent %d prompts to %s\n", sent, o.topic)
	return err
}

// publish feeds recs to the async producer in order and waits for every
// acknowledgement. It stops feeding at the first failure or when ctx is
// done, and always drains what is in flight, so the count it returns is
// exactly what the brokers acknowledged. The idempotent producer with one
// request in flight per broker keeps each partition, hence each session,
// in file order.
func publish(ctx context.Context, producer sarama.AsyncProducer, topic string, recs []record, prog progress) (int, error) {
	var (
		next, inflight, acked int
		failed                error
		msg                   *sarama.ProducerMessage // the next one, built once
		done                  = ctx.Done()
	)
	for {
		feeding := next < len(recs) && failed == nil && ctx.Err() == nil
		if !feeding && inflight == 0 {
			break
		}
		var input chan<- *sarama.ProducerMessage
		if feeding {
			input = producer.Input()
			if msg == nil {
				r := recs[next]
				msg = &sarama.ProducerMessage{
					Topic: topic, Key: sarama.StringEncoder(r.key), Value: sarama.ByteEncoder(r.value), Metadata: r.line,
				}
			}
		}
		select {
		case input <- msg:
			msg = nil
			next++
			inflight++
		case <-producer.Successes():
			inflight--
			acked++
			prog.Add(1)
		case perr := <-producer.Errors():
			inflight--
			if failed == nil {
				failed = fmt.Errorf("line %v: %w", perr.Msg.Metadata, perr.Err)
			}
		case <-done:
			done = nil // stop feeding; keep draining
		}
	}
	if failed == nil && ctx.Err() != nil {
		failed = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	return acked, failed
}
