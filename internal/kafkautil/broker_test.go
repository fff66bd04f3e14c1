package kafkautil_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

func TestBrokerOverTCP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", DataDir: dir, Partitions: 4})
	require.NoError(t, err)

	cfg := kafkautil.NewConfig("test")
	admin, err := sarama.NewClusterAdmin([]string{b.Addr()}, cfg)
	require.NoError(t, err)
	created, err := kafkautil.EnsureTopics(admin, kafkautil.Topics{}.WithDefaults(), 4, 1, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"prompts", "wakes", "session-events", "prompts.rejects", "permission-replies", "session-deltas"}, created)
	again, err := kafkautil.EnsureTopics(admin, kafkautil.Topics{}.WithDefaults(), 4, 1, nil)
	require.NoError(t, err)
	require.Empty(t, again)
	require.NoError(t, admin.Close())

	prod, err := sarama.NewSyncProducer([]string{b.Addr()}, cfg)
	require.NoError(t, err)
	part, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder("s-1"), Value: sarama.StringEncoder("v")})
	require.NoError(t, err)
	require.Equal(t, kafkautil.Murmur2Partition([]byte("s-1"), 4), part)
	require.NoError(t, prod.Close())
	b.Close()

	// DataDir keeps the record across a restart on another port.
	b2, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0", DataDir: dir})
	require.NoError(t, err)
	defer b2.Close()
	client, err := sarama.NewClient([]string{b2.Addr()}, cfg)
	require.NoError(t, err)
	defer client.Close()
	var hwm int64
	require.Eventually(t, func() bool {
		hwm, err = client.GetOffset("prompts", part, sarama.OffsetNewest)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, int64(1), hwm)
}

// Existing prompts and wakes topics with different partition counts cost
// sessions their partition affinity: EnsureTopics says so.
func TestEnsureTopicsWarnsOnPartitionMismatch(t *testing.T) {
	t.Parallel()
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer b.Close()
	admin, err := sarama.NewClusterAdmin([]string{b.Addr()}, kafkautil.NewConfig("test"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic("prompts", &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false))
	require.NoError(t, admin.CreateTopic("wakes", &sarama.TopicDetail{NumPartitions: 8, ReplicationFactor: 1}, false))

	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	created, err := kafkautil.EnsureTopics(admin, kafkautil.Topics{}.WithDefaults(), 4, 1, log)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"session-events", "prompts.rejects", "permission-replies", "session-deltas"}, created)
	require.Contains(t, logs.String(), "prompts and wakes differ in partition count")
	require.Contains(t, logs.String(), `"prompts_partitions":4`)
	require.Contains(t, logs.String(), `"wakes_partitions":8`)
}

// EnsureTopics creates every topic uncompacted whatever the broker's
// default (a compacted prompts topic would keep only each session's last
// prompt, and replay needs them all), and with three replicas or more
// needs two in sync for an acks=all write (docs/deploy.md, "Kafka: topics").
func TestEnsureTopicsConfig(t *testing.T) {
	t.Parallel()
	b, err := kafkautil.StartBroker(kafkautil.BrokerConfig{Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	defer b.Close()
	admin, err := sarama.NewClusterAdmin([]string{b.Addr()}, kafkautil.NewConfig("test"))
	require.NoError(t, err)
	defer admin.Close()
	topics := kafkautil.Topics{}.WithDefaults()
	_, err = kafkautil.EnsureTopics(admin, topics, 2, 1, nil)
	require.NoError(t, err)
	for _, name := range topics.All() {
		res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: name}}, sarama.DescribeConfigsOptions{})
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.Equal(t, sarama.ErrNoError, res[0].ErrorCode, res[0].ErrorMsg)
		entries := res[0].Configs
		var policy *sarama.ConfigEntry
		for _, e := range entries {
			if e.Name == "cleanup.policy" {
				policy = &e
			}
		}
		require.NotNil(t, policy, name)
		require.Equal(t, "delete", policy.Value, name)
		require.Equal(t, sarama.SourceTopic, policy.Source, "%s: set on the topic, not the broker's default", name)
	}

	require.Equal(t, map[string]string{"cleanup.policy": "delete"}, values(kafkautil.TopicConfig(1)))
	require.Equal(t, map[string]string{"cleanup.policy": "delete", "min.insync.replicas": "2"}, values(kafkautil.TopicConfig(3)))
}

func values(m map[string]*string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = *v
	}
	return out
}

// A message the producer accepts (Producer.MaxMessageBytes, the consumer's
// --max-message-bytes default) fits a topic at Kafka's default
// max.message.bytes (1048588), which counts the whole record batch: its
// 61-byte header on top of the record. Sarama counts neither that header
// nor a record's true overhead, so a producer limit of 1 MiB let through
// messages the broker then refused.
func TestMaxMessageBytesDefaultFitsADefaultTopic(t *testing.T) {
	t.Parallel()
	// Apache Kafka too under make test/kafka: its topics created by
	// EnsureTopics, max.message.bytes at the default.
	b := testkit.Broker(t, 1)
	prod, err := sarama.NewSyncProducer([]string{b.Addr()}, kafkautil.NewConfig("test"))
	require.NoError(t, err)
	defer prod.Close()
	m := &sarama.ProducerMessage{Topic: "prompts.rejects", Key: sarama.StringEncoder("session-1"),
		Headers: []sarama.RecordHeader{{Key: []byte("reason"), Value: []byte("invalid_json")}}}
	m.Value = sarama.ByteEncoder(bytes.Repeat([]byte("x"), kafkautil.MaxMessageBytesDefault-m.ByteSize(2)))
	require.Equal(t, kafkautil.MaxMessageBytesDefault, m.ByteSize(2), "the largest message the producer sends")
	_, _, err = prod.SendMessage(m)
	require.NoError(t, err, "the broker takes it (topic max.message.bytes %d)", kafkautil.KafkaDefaultMaxMessageBytes)
}
