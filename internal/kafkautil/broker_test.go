package kafkautil_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
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
	require.ElementsMatch(t, []string{"prompts", "wakes", "session-events", "prompts.rejects", "permission-replies"}, created)
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
	require.ElementsMatch(t, []string{"session-events", "prompts.rejects", "permission-replies"}, created)
	require.Contains(t, logs.String(), "prompts and wakes differ in partition count")
	require.Contains(t, logs.String(), `"prompts_partitions":4`)
	require.Contains(t, logs.String(), `"wakes_partitions":8`)
}
