package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promptline/promptline/envelope"
)

// ErrClosed is returned by the methods of a Producer or a Watcher after
// Close.
var ErrClosed = errors.New("client: closed")

// Producer publishes prompts and permission replies to promptline. It is
// safe for concurrent use. Records of one session keep the order in which
// their sends began: the idempotent producer keeps one request in flight
// per broker and retries without reordering or duplicating.
type Producer struct {
	cfg      Config
	producer sarama.AsyncProducer
	// maxRecordBytes is Sarama's Producer.MaxMessageBytes, checked by fits.
	maxRecordBytes int
	done           chan struct{} // closed when dispatch returns

	mu     sync.RWMutex // held for reading while feeding the input channel
	closed bool
	once   sync.Once
}

// ack is a record's outcome, delivered by dispatch.
type ack struct {
	index     int
	partition int32
	offset    int64
	err       error
}

// pending is a record's Metadata: where dispatch delivers its outcome.
// acks is buffered for every record that can be in flight on it, so that
// dispatch never blocks.
type pending struct {
	index int
	acks  chan<- ack
}

// NewProducer connects to the brokers. Close it when done.
func NewProducer(config *Config) (*Producer, error) {
	cfg, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	sc, err := cfg.sarama()
	if err != nil {
		return nil, err
	}
	ap, err := sarama.NewAsyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("creating the producer: %w", cfg.connectError(err))
	}
	p := &Producer{cfg: cfg, producer: ap, maxRecordBytes: sc.Producer.MaxMessageBytes, done: make(chan struct{})}
	go p.dispatch()
	return p, nil
}

// dispatch hands every acknowledgement and error to the record's waiter.
// It returns when Close has closed the producer, which closes both
// channels once everything in flight is settled.
func (p *Producer) dispatch() {
	defer close(p.done)
	successes, errs := p.producer.Successes(), p.producer.Errors()
	for successes != nil || errs != nil {
		select {
		case m, ok := <-successes:
			if !ok {
				successes = nil
				continue
			}
			w := m.Metadata.(pending)
			w.acks <- ack{index: w.index, partition: m.Partition, offset: m.Offset}
		case perr, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w := perr.Msg.Metadata.(pending)
			w.acks <- ack{index: w.index, partition: -1, offset: -1, err: perr.Err}
		}
	}
}

// NewMessageID returns a new message ID, a UUIDv7. Generate it once per
// prompt and reuse it on every retry.
func NewMessageID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Send validates p with the rules admission applies and publishes it, key
// = session ID, and returns where it was written (-1, -1 with an error). p.MessageID is required
// (NewMessageID). When ctx ends before the brokers answered, Send returns
// ctx's error and the prompt may or may not have been written: send it
// again with the same message ID, which is an exact retry.
func (p *Producer) Send(ctx context.Context, prompt envelope.Prompt) (partition int32, offset int64, err error) {
	msg, err := p.promptMessage(prompt)
	if err != nil {
		return -1, -1, fmt.Errorf("sending prompt %q: %w", prompt.MessageID, err)
	}
	partition, offset, err = p.sendOne(ctx, msg)
	if err != nil {
		return -1, -1, fmt.Errorf("sending prompt %q to %s: %w", prompt.MessageID, p.cfg.PromptsTopic, err)
	}
	return partition, offset, nil
}

// Reply answers the permission request requestID of session (the
// request_id of its permission.asked event) with envelope.ReplyOnce,
// ReplyAlways or ReplyReject; message goes only with ReplyReject and is
// handed back to the model as feedback (without one the turn fails with
// reason declined). The reply is validated as admission will, then
// published to the permission-replies topic, key = session ID; it returns
// where it was written (-1, -1 with an error). Replies are
// admitted once: sending the same reply again is a duplicate, another
// reply to an answered request is rejected as a conflict.
func (p *Producer) Reply(ctx context.Context, session, requestID, reply, message string) (partition int32, offset int64, err error) {
	msg, err := p.replyMessage(session, envelope.PermissionReply{RequestID: requestID, Reply: reply, Message: message})
	if err != nil {
		return -1, -1, fmt.Errorf("replying to permission request %q: %w", requestID, err)
	}
	partition, offset, err = p.sendOne(ctx, msg)
	if err != nil {
		return -1, -1, fmt.Errorf("replying to permission request %q on %s: %w", requestID, p.cfg.RepliesTopic, err)
	}
	return partition, offset, nil
}

// SendBatchOpts are the options of one SendBatch.
type SendBatchOpts struct {
	// ProgressFunc, when set, is called with the number of prompts
	// acknowledged so far, after each acknowledgement, on SendBatch's
	// goroutine. Defaults to none.
	ProgressFunc func(acked int)
}

// BatchError is the first failure of a SendBatch: the position in the
// batch and the message ID of the prompt at fault, and why.
type BatchError struct {
	Index     int
	MessageID string
	Err       error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("prompt %d (%q): %v", e.Index, e.MessageID, e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// SendBatch validates every prompt first, as admission will (a message ID
// used twice with different payloads is a conflict), and sends nothing
// when one is invalid. Then it publishes them all, each session's prompts
// in batch order, and waits for every acknowledgement. It stops feeding
// at the first failure or when ctx ends, and waits for what is in flight,
// so the count it returns is exactly what the brokers acknowledged. Every
// error is, or wraps, a *BatchError, except ctx's and ErrClosed. Sending
// the batch again after a failure is safe: a prompt already written is an
// exact retry.
func (p *Producer) SendBatch(ctx context.Context, prompts []envelope.Prompt, opts *SendBatchOpts) (int, error) {
	if opts == nil {
		opts = &SendBatchOpts{}
	}
	msgs := make([]*sarama.ProducerMessage, len(prompts))
	hashes := make(map[string]int, len(prompts))
	for i, pr := range prompts {
		m, err := p.promptMessage(pr)
		if err != nil {
			return 0, &BatchError{Index: i, MessageID: pr.MessageID, Err: err}
		}
		if j, ok := hashes[pr.MessageID]; ok && string(prompts[j].Hash()) != string(pr.Hash()) {
			return 0, &BatchError{Index: i, MessageID: pr.MessageID, Err: fmt.Errorf("%s: message_id is used by prompt %d with another payload", envelope.ReasonConflict, j)}
		} else if !ok {
			hashes[pr.MessageID] = i
		}
		msgs[i] = m
	}

	acks := make(chan ack, len(msgs))
	var (
		next, inflight, acked int
		failed                error
		done                  = ctx.Done()
	)
	for {
		feeding := next < len(msgs) && failed == nil && ctx.Err() == nil
		if !feeding && inflight == 0 {
			break
		}
		if feeding {
			msgs[next].Metadata = pending{index: next, acks: acks}
			switch err := p.enqueue(ctx, msgs[next]); {
			case err == nil:
				next++
				inflight++
				continue
			case errors.Is(err, ErrClosed):
				failed = err
				continue
			}
			// ctx ended: stop feeding, keep draining.
			continue
		}
		select {
		case a := <-acks:
			inflight--
			if a.err != nil {
				if failed == nil {
					failed = &BatchError{Index: a.index, MessageID: prompts[a.index].MessageID, Err: a.err}
				}
				continue
			}
			acked++
			if opts.ProgressFunc != nil {
				opts.ProgressFunc(acked)
			}
		case <-done:
			done = nil // keep draining
		}
	}
	if failed == nil && ctx.Err() != nil {
		failed = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if failed != nil {
		return acked, fmt.Errorf("sent %d of %d prompts to %s: %w", acked, len(msgs), p.cfg.PromptsTopic, failed)
	}
	return acked, nil
}

// enqueue hands msg to the producer; it fails with ctx's error or
// ErrClosed. The read lock keeps Close from closing the input channel
// under a send.
func (p *Producer) enqueue(ctx context.Context, msg *sarama.ProducerMessage) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	select {
	case p.producer.Input() <- msg:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// sendOne publishes msg and waits for its acknowledgement.
func (p *Producer) sendOne(ctx context.Context, msg *sarama.ProducerMessage) (int32, int64, error) {
	acks := make(chan ack, 1)
	msg.Metadata = pending{acks: acks}
	if err := p.enqueue(ctx, msg); err != nil {
		return -1, -1, err
	}
	select {
	case a := <-acks:
		return a.partition, a.offset, a.err
	case <-ctx.Done():
		return -1, -1, fmt.Errorf("outcome unknown (retry with the same ID): %w", context.Cause(ctx))
	}
}

// promptMessage validates prompt with admission's rules and builds its
// record.
func (p *Producer) promptMessage(prompt envelope.Prompt) (*sarama.ProducerMessage, error) {
	if prompt.MessageID == "" {
		return nil, &envelope.RejectError{Reason: envelope.ReasonMissingField, Detail: "message_id is required (client.NewMessageID makes one)"}
	}
	if err := validUTF8("message_id", prompt.MessageID, "session_id", prompt.SessionID, "text", prompt.Text); err != nil {
		return nil, err
	}
	value, err := envelope.Marshal(prompt)
	if err != nil {
		return nil, fmt.Errorf("encoding the envelope: %w", err)
	}
	if _, err := envelope.Decode([]byte(prompt.SessionID), value, p.cfg.Limits); err != nil {
		return nil, err
	}
	return p.fits(&sarama.ProducerMessage{Topic: p.cfg.PromptsTopic, Key: sarama.StringEncoder(prompt.SessionID), Value: sarama.ByteEncoder(value)})
}

// fits refuses, as too_large, a record that Sarama would refuse: a value
// within admission's limit (1 MiB) can still make a record, with its key
// and the record's overhead, larger than the batch the broker's default
// max.message.bytes holds, and Sarama's own error then was a
// configuration error naming its setting, not the prompt.
func (p *Producer) fits(msg *sarama.ProducerMessage) (*sarama.ProducerMessage, error) {
	if n := msg.ByteSize(2); n > p.maxRecordBytes {
		return nil, &envelope.RejectError{Reason: envelope.ReasonTooLarge, Detail: fmt.Sprintf(
			"the record is %d bytes with its key and the record's overhead, over the %d a record batch holds "+
				"under Kafka's default max.message.bytes: shorten the text", n, p.maxRecordBytes)}
	}
	return msg, nil
}

// replyMessage validates a permission reply with admission's rules and
// builds its record.
func (p *Producer) replyMessage(session string, r envelope.PermissionReply) (*sarama.ProducerMessage, error) {
	if session == "" {
		return nil, errors.New("the session ID (the record's key) is required")
	}
	// Admission takes the key as the request's session; one no session
	// can have would only come back as a reject.
	if err := envelope.ValidSessionID(session, p.cfg.Limits); err != nil {
		return nil, err
	}
	if err := validUTF8("request_id", r.RequestID, "message", r.Message); err != nil {
		return nil, err
	}
	value, err := envelope.MarshalReply(r)
	if err != nil {
		return nil, fmt.Errorf("encoding the reply: %w", err)
	}
	if _, err := envelope.DecodeReply(value, p.cfg.Limits); err != nil {
		return nil, err
	}
	return p.fits(&sarama.ProducerMessage{Topic: p.cfg.RepliesTopic, Key: sarama.StringEncoder(session), Value: sarama.ByteEncoder(value)})
}

// validUTF8 refuses, as admission refuses the value (invalid_utf8), a
// field that is not valid UTF-8; nameValues alternates names and values.
// Checked before encoding: json.Marshal replaces bad bytes with U+FFFD,
// and the value sent would pass admission with a text the caller never
// wrote.
func validUTF8(nameValues ...string) error {
	for i := 0; i+1 < len(nameValues); i += 2 {
		if !utf8.ValidString(nameValues[i+1]) {
			return &envelope.RejectError{Reason: envelope.ReasonInvalidUTF8, Detail: nameValues[i] + " is not valid UTF-8"}
		}
	}
	return nil
}

// Close waits for the records in flight (their senders get their
// outcomes) and disconnects. Sends after Close fail with ErrClosed; Close
// may be called more than once.
func (p *Producer) Close() error {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		// AsyncClose, not Close: Close would read the Successes and Errors
		// channels itself, and a sender would miss its outcome. dispatch
		// drains both until Sarama closes them.
		p.producer.AsyncClose()
		<-p.done
	})
	return nil
}
