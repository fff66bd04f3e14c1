package kafkautil

import (
	"sync"
	"time"

	"github.com/IBM/sarama"
	gometrics "github.com/rcrowley/go-metrics"
)

// disableGoMetrics turns off Sarama's go-metrics registry, whose meters
// start goroutines that never stop; promptline exports its own metrics.
var disableGoMetrics = sync.OnceFunc(func() { gometrics.UseNilMetrics = true })

// Version is the Kafka protocol version promptline speaks: it has the
// idempotent producer, consumer groups and ListOffsets by time, and both
// kfake and Apache Kafka 3.x/4.x accept it.
var Version = sarama.V3_6_0_0

// KafkaDefaultMaxMessageBytes is Apache Kafka's default max.message.bytes
// of a topic (message.max.bytes of the broker): the largest record batch
// it takes, 1 MiB and the 12 bytes of its log overhead.
const KafkaDefaultMaxMessageBytes = 1048588

// RecordBatchHeaderBytes is the header of a record batch (format v2) that
// a topic's max.message.bytes counts and Sarama's Producer.MaxMessageBytes
// does not.
const RecordBatchHeaderBytes = 61

// MaxMessageBytesDefault is the largest message a promptline producer
// sends unless told otherwise (consumer --max-message-bytes), by Sarama's
// measure (key, value, headers and the most a record's own fields can
// take): the largest whose batch fits a topic at Kafka's default
// max.message.bytes, 1048527. A topic's max.message.bytes must be at least
// the producer's limit plus RecordBatchHeaderBytes (docs/deploy.md). It
// was Sarama's default, 1 MiB, which let through messages of the last 49
// bytes below it that a default topic refuses.
const MaxMessageBytesDefault = KafkaDefaultMaxMessageBytes - RecordBatchHeaderBytes

// NewConfig returns the Sarama configuration shared by every promptline
// client: the idempotent producer with acks=all and the murmur2 partitioner;
// consumers read committed data only; a request unanswered for 15s is given
// up. A consumer group's client takes GroupConfig of it.
func NewConfig(clientID string) *sarama.Config {
	disableGoMetrics()
	c := sarama.NewConfig()
	c.ClientID = clientID
	c.Version = Version
	c.Metadata.RefreshFrequency = 30 * time.Second

	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Net.MaxOpenRequests = 1 // required by the idempotent producer
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = NewMurmur2Partitioner
	c.Producer.Flush.Frequency = time.Millisecond
	c.Producer.MaxMessageBytes = MaxMessageBytesDefault

	c.Consumer.Return.Errors = true
	// Only committed data: a prompt of an aborted transaction never ran
	// for its producer and must not run here, and records of a transaction
	// still open are delivered once it commits.
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	c.Consumer.Group.Session.Timeout = 10 * time.Second
	c.Consumer.Group.Heartbeat.Interval = time.Second
	c.Consumer.Group.Rebalance.Timeout = 60 * time.Second
	// Every other request is answered within Producer.Timeout (a produce
	// at acks=all waits that long for the replicas at most) or at once: a
	// broker that has not answered 5s later is stopped or cut off, and the
	// client should give its request up and look for the partition's new
	// leader, as Java's request.timeout.ms does. The consumer group's
	// client needs longer (GroupConfig).
	c.Net.ReadTimeout = c.Producer.Timeout + 5*time.Second
	c.Consumer.MaxWaitTime = 50 * time.Millisecond
	// Admission batches what is already in a partition's channel; Sarama's
	// default buffer (256) capped batches below --max-batch (measured:
	// 1.37x admission throughput with 1024, docs/benchmarks.md). A
	// consumer of prompts sizes it by bytes instead (ChannelBufferFor).
	c.ChannelBufferSize = ChannelBufferMax
	return c
}

// ChannelBufferMax is the most messages a partition's channel holds: the
// size that lets admission batches reach the default --max-batch.
const ChannelBufferMax = 1024

// BufferBytesDefault is the consumer's --buffer-bytes when it is not set:
// the most bytes of fetched prompt values one owned partition holds before
// and during their admission, half in Sarama's channel counted at
// --max-value-bytes each, half in admission's queue counted at their real
// sizes (pipeline.ConsumerConfig.BufferBytes; docs/benchmarks.md, "The
// consumer's buffer by bytes"). Defaults to 32 MiB. `consumer replay`'s
// --buffer-bytes has the same default and gives all of it to the channel:
// replay has no queue after it (docs/replay.md, "Memory").
const BufferBytesDefault = 32 << 20

// ChannelBufferFor is the ChannelBufferSize of a consumer that may hold
// bufferBytes of values per partition when a value may be maxValueBytes
// long: bufferBytes / maxValueBytes messages, at least 1 and at most
// ChannelBufferMax. Sarama's channel counts messages, not bytes, so a
// backlog of the largest prompts filled 1024 of them per partition (about
// 1 GiB each at 1 MiB) and a consumer under a memory limit was killed
// again at every restart; counted at the largest value, the channel never
// holds more than bufferBytes (or one value, when a value is larger).
// What else a partition holds: the fetch response being fed to the
// channel (Consumer.Fetch.Default, or one value when larger) and the batch
// admission is writing.
func ChannelBufferFor(bufferBytes, maxValueBytes int) int {
	if maxValueBytes < 1 {
		return ChannelBufferMax
	}
	return min(max(bufferBytes/maxValueBytes, 1), ChannelBufferMax)
}

// GroupConfig returns a copy of c for a consumer group's client. The
// broker answers a JoinGroup when the join phase ends, up to the
// rebalance timeout later (it waits that long for members that do not
// rejoin). Sarama bounds every response by Net.ReadTimeout: shorter
// (Sarama's default 30s against 60s), every member gives its JoinGroup up
// and joins again before the phase ends, and the group never settles. 5s
// more than the rebalance, like the Java client's JoinGroup. Sarama has
// one read timeout per client, so the group's fetches and heartbeats get
// it as well: a stopped broker holds them that long unless a BrokerWatch
// cuts it off first. Producers and other clients keep NewConfig's.
func GroupConfig(c *sarama.Config) *sarama.Config {
	g := *c
	g.Net.ReadTimeout = g.Consumer.Group.Rebalance.Timeout + 5*time.Second
	return &g
}
