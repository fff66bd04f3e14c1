package kafkautil

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/retry"
)

// RejectPublisher sends rejects to the rejects topic for live admission
// and for replay alike, so that both keep the same promise: a reject is
// never dropped for a transient error, one too large to publish whole is
// published truncated, and one the broker refuses for good is dropped,
// logged and counted, instead of stopping its partition
// (docs/session-events.md, prompts.rejects).
type RejectPublisher struct {
	Producer sarama.SyncProducer
	// MaxMessageBytes is the producer's Producer.MaxMessageBytes: the
	// budget a reject is first cut to. Defaults to MaxMessageBytesDefault.
	MaxMessageBytes int
	// Logger logs retries, truncations and drops. Defaults to none.
	Logger *slog.Logger
	// OnPublishedFunc is called once per reject with its reason, its
	// outcome ("rejected" when published, whole or truncated;
	// "reject_unpublished" when dropped: too large even without its value,
	// or refused for good) and the topic of the message rejected. Defaults
	// to none.
	OnPublishedFunc func(reason, outcome, sourceTopic string)
}

// Publish publishes rejects, retrying with a bounded backoff while
// the rejects topic is unavailable (a broker down, a leader moving, a
// topic missing or an ACL not yet granted): a transient error never drops
// a reject. A reject refused for its size, which no retry fixes (it is
// larger than its original: the key and value plus the headers), is
// published truncated instead: first to the producer's limit, then, each
// time the broker refuses it again (a topic max.message.bytes below the
// producer's), to half of that; a reject refused together with others is
// sent alone first, since the broker's limit applies to a record batch. Only one that cannot be published even
// without its value, key and the original's headers is dropped, or one the broker refuses for what it
// is (refusedForGood: a keyless reject on a compacted rejects topic), once
// sent alone: logged at error level with its source and counted (outcome
// reject_unpublished); its original stays in the source topic.
func (rp *RejectPublisher) Publish(ctx context.Context, rejects []*sarama.ProducerMessage) error {
	pending := make([]*pendingReject, len(rejects))
	for i, r := range rejects {
		pending[i] = &pendingReject{orig: r, budget: cmp.Or(rp.MaxMessageBytes, MaxMessageBytesDefault)}
	}
	// A round that only shrank or split rejects goes on at once; one
	// with a transient failure waits first.
	err := retry.Do(ctx, retry.Policy{
		Min: 100 * time.Millisecond, Max: 5 * time.Second,
		// Ended by a rebalance or a shutdown: no retry to announce.
		Final: func(error) bool { return ctx.Err() != nil },
		OnRetry: func(_ int, err error, wait time.Duration) {
			rp.log().WarnContext(ctx, "publishing rejects failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
		},
	}, func() error {
		for len(pending) > 0 {
			var transient error
			if pending, transient = rp.round(ctx, pending); transient != nil {
				return transient
			}
		}
		return nil
	})
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// round sends pending once and returns the rejects to send again and the
// last transient failure, if there was one.
func (rp *RejectPublisher) round(ctx context.Context, pending []*pendingReject) ([]*pendingReject, error) {
	var again []*pendingReject
	var transient error
	for _, call := range sendCalls(pending) {
		msgs, failed, err := rp.send(ctx, call)
		if err != nil {
			return pending, err
		}
		var split error
		for i, p := range call {
			perr, ok := failed[msgs[i]]
			switch {
			case !ok:
				rp.count(p.orig, "rejected")
			case !tooLarge(perr) && !refusedForGood(perr):
				transient = perr
				again = append(again, p)
			case len(call) > 1:
				// The broker's limit is on a record batch, and it
				// refuses a batch whole for one bad record: refused
				// together, it may be taken alone.
				p.alone = true
				again = append(again, p)
				split = perr
			case tooLarge(perr) && p.shrink(msgs[i]):
				rp.log().WarnContext(ctx, "reject refused for its size; publishing it truncated", slog.Any("error", perr),
					slog.Int("limit", p.budget), slog.String("reason", header(p.orig, "reason")))
				again = append(again, p)
			case tooLarge(perr):
				rp.drop(ctx, p, perr, "reject refused for its size even without its value; dropped (the original stays in its topic)")
			default:
				rp.drop(ctx, p, perr, "reject refused by the broker for what it is, which no retry changes; dropped (the original stays in its topic)")
			}
		}
		if split != nil {
			rp.log().WarnContext(ctx, "rejects refused together; sending each alone", slog.Int("rejects", len(call)), slog.Any("error", split))
		}
	}
	return again, transient
}

// sendCalls splits pending, in order, into the calls to send: each run of
// rejects sent together, each reject to be sent alone by itself.
func sendCalls(pending []*pendingReject) [][]*pendingReject {
	var calls [][]*pendingReject
	for i, p := range pending {
		if p.alone || i == 0 || calls[len(calls)-1][0].alone {
			calls = append(calls, []*pendingReject{p})
			continue
		}
		calls[len(calls)-1] = append(calls[len(calls)-1], p)
	}
	return calls
}

// send publishes the messages of call and returns them with the error of
// each one that failed, or ctx's error when ctx ends first.
//
// Sarama's SendMessages takes no context: a rejects topic that does not
// answer holds it for the producer's whole retry budget (Producer.Retry.Max
// retries of a request given up after Net.ReadTimeout: minutes), longer
// than a consumer group's rebalance timeout. Ended by a rebalance or a
// shutdown, send returns at once and leaves the call to finish on its own
// (Sarama bounds it; closing the producer ends it): its messages may still
// be published, and the caller, which marks no offset, has the next owner
// publish them again, a duplicate reject as after a crash.
func (rp *RejectPublisher) send(ctx context.Context, call []*pendingReject) ([]*sarama.ProducerMessage, map[*sarama.ProducerMessage]error, error) {
	msgs := make([]*sarama.ProducerMessage, len(call))
	for i, p := range call {
		msgs[i] = p.message()
	}
	sent := make(chan error, 1)
	go func() { sent <- rp.Producer.SendMessages(msgs) }()
	var err error
	select {
	case err = <-sent:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	failed := map[*sarama.ProducerMessage]error{}
	var perrs sarama.ProducerErrors
	switch {
	case err == nil:
	case errors.As(err, &perrs):
		for _, pe := range perrs {
			failed[pe.Msg] = pe.Err
		}
	default: // the whole call failed: every message again
		for _, m := range msgs {
			failed[m] = err
		}
	}
	return msgs, failed, nil
}

// drop gives p up: logged at error level with its source, and counted.
func (rp *RejectPublisher) drop(ctx context.Context, p *pendingReject, err error, msg string) {
	rp.log().ErrorContext(ctx, msg, slog.Any("error", err), slog.String("reason", header(p.orig, "reason")),
		slog.String("source_topic", header(p.orig, "source_topic")),
		slog.String("source_partition", header(p.orig, "source_partition")),
		slog.String("source_offset", header(p.orig, "source_offset")))
	rp.count(p.orig, "reject_unpublished")
}

func (rp *RejectPublisher) count(r *sarama.ProducerMessage, outcome string) {
	if rp.OnPublishedFunc != nil {
		rp.OnPublishedFunc(header(r, RejectHeaderReason), outcome, header(r, RejectHeaderSourceTopic))
	}
}

func (rp *RejectPublisher) log() *slog.Logger {
	if rp.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return rp.Logger
}

func header(m *sarama.ProducerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// tooLarge reports whether a publish failed for the message's size: Sarama
// refuses one above its own Producer.MaxMessageBytes with a
// ConfigurationError, the broker one above the topic's max.message.bytes
// with ErrMessageSizeTooLarge, and a batch above the topic's segment.bytes
// with ErrMessageSetSizeTooLarge (RECORD_LIST_TOO_LARGE). Kafka defines
// none of them as retriable; a smaller message fixes each.
func tooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.As(err, &ce) || errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrMessageSetSizeTooLarge)
}

// refusedForGood reports whether the broker refused a record for what it
// is, with an error Kafka defines as not retriable: INVALID_RECORD (a
// record without a key on a topic with cleanup.policy=compact, or one that
// fails another of the broker's checks of a record). Sending it again,
// unchanged, is refused again, forever.
//
// The other errors Kafka defines as not retriable are not about the record
// but about where it goes, and are retried like a broker that is away: an
// operator fixes them and the reject is published then (an ACL not yet
// granted, TOPIC_AUTHORIZATION_FAILED; a clock far from the broker's,
// INVALID_TIMESTAMP, as the producer stamps every record with its own
// time; a misconfigured producer; UNKNOWN_SERVER_ERROR, which says nothing
// of why). Size errors are tooLarge's: a smaller message fixes them.
func refusedForGood(err error) bool {
	return errors.Is(err, sarama.ErrInvalidRecord)
}

// pendingReject is a reject on its way to the rejects topic: the whole
// message, and the size it must now fit in.
type pendingReject struct {
	orig   *sarama.ProducerMessage
	budget int
	alone  bool // refused for its size with others: sent by itself
}

// recordVersion is the record format promptline produces (Kafka >= 0.11,
// Version): the one Sarama measures messages by.
const recordVersion = 2

// message returns a new message (Sarama keeps state in the ones it sent)
// for p: the whole reject when it fits its budget, else truncated to it.
// The value goes first; then, while the reject is still too large, the
// original's headers, or the key, or both, whichever first fits in this
// order (the key is the session, which the headers are not); when none
// fits, the smallest. Each cut is announced by its pair of headers; the
// value then gets the room left, as a prefix of the original's.
func (p *pendingReject) message() *sarama.ProducerMessage {
	if m := p.cut(rejectCut{}); m.ByteSize(recordVersion) <= p.budget {
		return m
	}
	var m *sarama.ProducerMessage
	for _, c := range []rejectCut{{value: true}, {value: true, headers: true}, {value: true, key: true}, {value: true, headers: true, key: true}} {
		if (c.key && p.orig.Key == nil) || (c.headers && len(p.originalHeaders()) == 0) {
			continue
		}
		next := p.cut(c)
		if m == nil || next.ByteSize(recordVersion) < m.ByteSize(recordVersion) || next.ByteSize(recordVersion) <= p.budget {
			m = next
		}
		if m.ByteSize(recordVersion) <= p.budget {
			break
		}
	}
	if room := p.budget - m.ByteSize(recordVersion); room > 0 {
		value := encoded(p.orig.Value)
		m.Value = sarama.ByteEncoder(value[:min(room, len(value))])
	}
	return m
}

// rejectCut says what of the original a reject goes without.
type rejectCut struct{ value, key, headers bool }

// cut returns the reject without what c says, each cut announced by its
// pair of headers (rejectCutPairs, in their order), a cut value empty.
func (p *pendingReject) cut(c rejectCut) *sarama.ProducerMessage {
	own, original := splitRejectHeaders(p.orig.Headers)
	m := &sarama.ProducerMessage{Topic: p.orig.Topic, Key: p.orig.Key, Value: p.orig.Value}
	m.Headers = slices.Clone(own)
	if c.value {
		m.Headers = append(m.Headers, cutPair(RejectHeaderOriginalValueBytes, RejectHeaderOriginalValueSHA256, encoded(p.orig.Value))...)
		m.Value = sarama.ByteEncoder(nil)
	}
	if c.key {
		m.Headers = append(m.Headers, cutPair(RejectHeaderOriginalKeyBytes, RejectHeaderOriginalKeySHA256, encoded(p.orig.Key))...)
		m.Key = nil
	}
	if c.headers {
		m.Headers = append(m.Headers, cutPair(RejectHeaderOriginalHeadersBytes, RejectHeaderOriginalHeadersSHA256, EncodeHeaders(original))...)
	} else {
		m.Headers = append(m.Headers, original...)
	}
	return m
}

// originalHeaders returns the original's headers that p carries.
func (p *pendingReject) originalHeaders() []sarama.RecordHeader {
	_, original := splitRejectHeaders(p.orig.Headers)
	return original
}

// cutPair is the pair of headers that says b was cut: its size and
// SHA-256.
func cutPair(bytesName, sha256Name string, b []byte) []sarama.RecordHeader {
	sum := sha256.Sum256(b)
	return []sarama.RecordHeader{
		{Key: []byte(bytesName), Value: []byte(strconv.Itoa(len(b)))},
		{Key: []byte(sha256Name), Value: []byte(hex.EncodeToString(sum[:]))},
	}
}

// shrink halves the budget of p after sent, its last message, was refused
// for its size; false when that makes no smaller message: nothing is left
// to cut.
func (p *pendingReject) shrink(sent *sarama.ProducerMessage) bool {
	next := &pendingReject{orig: p.orig, budget: min(p.budget, sent.ByteSize(recordVersion)) / 2}
	if next.message().ByteSize(recordVersion) >= sent.ByteSize(recordVersion) {
		return false
	}
	p.budget = next.budget
	return true
}

func encoded(e sarama.Encoder) []byte {
	if e == nil {
		return nil
	}
	b, _ := e.Encode()
	return b
}
