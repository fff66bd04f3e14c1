package testkit_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// TestBrokerHasPromptlineTopics: the broker of a test, embedded or Apache
// Kafka (PROMPTLINE_TEST_KAFKA=apache), has every promptline topic with the
// partitions asked for, and places a key where the Java client does.
func TestBrokerHasPromptlineTopics(t *testing.T) {
	t.Parallel()
	addr := testkit.Broker(t, 3).Addr()
	client, err := sarama.NewClient([]string{addr}, kafkautil.NewConfig("test"))
	require.NoError(t, err)
	defer client.Close()
	for _, topic := range (kafkautil.Topics{}).WithDefaults().All() {
		partitions, err := client.Partitions(topic)
		require.NoError(t, err, topic)
		require.Len(t, partitions, 3, topic)
	}
	prod, err := sarama.NewSyncProducerFromClient(client)
	require.NoError(t, err)
	defer prod.Close()
	part, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: "prompts", Key: sarama.StringEncoder("s-1"), Value: sarama.StringEncoder("v")})
	require.NoError(t, err)
	require.Equal(t, kafkautil.Murmur2Partition([]byte("s-1"), 3), part)
}
