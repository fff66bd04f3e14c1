package executor

import (
	"cmp"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/IBM/sarama"

	"github.com/promptline/promptline/envelope"
)

// DeltaSink takes a step's live text deltas. PublishDelta must never
// block: deltas are for display, and nothing about them may slow or fail
// the turn that streams them.
type DeltaSink interface {
	PublishDelta(d envelope.Delta)
}

// DeltaPublisherConfig configures a DeltaPublisher.
type DeltaPublisherConfig struct {
	// Topic receives the deltas, key = session ID. Defaults to
	// "session-deltas".
	Topic string
	// OnDeltaFunc runs once per delta with its result: "published" (the
	// broker acknowledged it) or "dropped". Defaults to nothing.
	OnDeltaFunc func(result string)
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// DeltaPublisher publishes deltas with the process's own Kafka producer,
// directly, never through the outbox: they are not durable (docs/
// session-events.md, "Live deltas"). A delta that finds the producer's
// input full, or that the producer fails to deliver (a broken topic, a
// broker down), is dropped and counted, and the turn goes on.
type DeltaPublisher struct {
	producer sarama.AsyncProducer
	cfg      DeltaPublisherConfig

	// queue holds deltas for the producer: Sarama's input channel is
	// unbuffered, so a delta handed over while its dispatcher is busy
	// would be dropped for nothing.
	queue     chan *sarama.ProducerMessage
	mu        sync.Mutex
	closed    bool
	forwarded chan struct{}
	done      chan struct{}
}

// deltaQueueDefault is how many deltas may wait for the producer; more
// are dropped.
const deltaQueueDefault = 1024

var _ DeltaSink = (*DeltaPublisher)(nil)

// NewDeltaPublisher returns a publisher over producer, which it owns: Close
// closes it. The producer must return its errors (Return.Errors); its
// successes are counted when it returns them.
func NewDeltaPublisher(producer sarama.AsyncProducer, config *DeltaPublisherConfig) *DeltaPublisher {
	cfg := *config
	cfg.Topic = cmp.Or(cfg.Topic, "session-deltas")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &DeltaPublisher{producer: producer, cfg: cfg, queue: make(chan *sarama.ProducerMessage, deltaQueueDefault),
		forwarded: make(chan struct{}), done: make(chan struct{})}
	go p.forward()
	go p.drain()
	return p
}

// DeltaProducerConfig derives the deltas producer's configuration from the
// process's: a lost delta costs nothing, so it is neither idempotent nor
// retried much, and it waits for the leader only. Its own connections keep
// it from queueing behind the relay's durable publications.
func DeltaProducerConfig(base *sarama.Config) *sarama.Config {
	c := *base
	c.ClientID = base.ClientID + "-deltas"
	c.Producer.Retry.Max = 1
	// One request in flight keeps a session's deltas in order on a retry.
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	return &c
}

// PublishDelta hands d to the producer without waiting; a full producer
// drops it.
func (p *DeltaPublisher) PublishDelta(d envelope.Delta) {
	value, err := json.Marshal(d)
	if err != nil {
		p.count("dropped")
		return
	}
	msg := &sarama.ProducerMessage{Topic: p.cfg.Topic, Key: sarama.StringEncoder(d.SessionID), Value: sarama.ByteEncoder(value)}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.count("dropped")
		return
	}
	select {
	case p.queue <- msg:
	default:
		p.count("dropped")
	}
}

// Close flushes what the producer holds (bounded by its own timeouts) and
// closes it; deltas published after Close are dropped. It may be called
// twice.
func (p *DeltaPublisher) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.queue)
	}
	p.mu.Unlock()
	<-p.forwarded
	<-p.done
}

// forward hands the queued deltas to the producer, then closes it.
func (p *DeltaPublisher) forward() {
	defer close(p.forwarded)
	for msg := range p.queue {
		p.producer.Input() <- msg
	}
	p.producer.AsyncClose()
}

// drain counts the producer's results until it has closed both channels.
func (p *DeltaPublisher) drain() {
	defer close(p.done)
	var successes sync.WaitGroup
	successes.Go(func() {
		for range p.producer.Successes() {
			p.count("published")
		}
	})
	for e := range p.producer.Errors() {
		p.count("dropped")
		p.cfg.Logger.Debug("delta dropped", slog.Any("error", e.Err))
	}
	successes.Wait()
}

func (p *DeltaPublisher) count(result string) {
	if f := p.cfg.OnDeltaFunc; f != nil {
		f(result)
	}
}
