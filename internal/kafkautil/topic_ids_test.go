package kafkautil_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/testkit"
)

// A topic's ID is the same at every look, and another once the topic was
// deleted and created again under its name; a topic the cluster does not
// know is left out. The consumer reads a consumed topic again from its
// oldest offset when its ID changes (pipeline.ConsumerConfig.TopicIDsFunc),
// so an ID that changed at every look would end every assignment.
func TestTopicIDs(t *testing.T) {
	t.Parallel()
	b := testkit.Broker(t, 2)
	cfg := kafkautil.NewConfig("test-ids")
	client, err := sarama.NewClient([]string{b.Addr()}, cfg)
	require.NoError(t, err)
	defer client.Close()
	ids := kafkautil.TopicIDs(client)

	first, err := ids([]string{"prompts", "wakes", "no-such-topic"})
	require.NoError(t, err)
	require.Len(t, first, 2, "the two topics, not the missing one: %v", first)
	require.NotEqual(t, first["prompts"], first["wakes"])
	again, err := ids([]string{"prompts", "wakes"})
	require.NoError(t, err)
	require.Equal(t, first, again, "the same IDs at every look")

	admin, err := sarama.NewClusterAdminFromClient(client)
	require.NoError(t, err)
	require.NoError(t, admin.DeleteTopic("prompts"))
	var now map[string]sarama.Uuid
	require.Eventually(t, func() bool {
		now, err = ids([]string{"prompts"})
		return err == nil && len(now) == 0
	}, 30*time.Second, 50*time.Millisecond, "prompts gone")
	require.NoError(t, admin.CreateTopic("prompts", &sarama.TopicDetail{NumPartitions: 2, ReplicationFactor: 1}, false))
	require.Eventually(t, func() bool {
		now, err = ids([]string{"prompts"})
		return err == nil && len(now) == 1
	}, 30*time.Second, 50*time.Millisecond, "prompts back")
	require.NotEqual(t, first["prompts"], now["prompts"], "a new ID for the topic created again")

	oldest, err := kafkautil.OldestOffset(client)("prompts", 1)
	require.NoError(t, err)
	require.Zero(t, oldest)
}

// The metadata a group commits with an offset is read back per partition;
// a partition with no commit reads "".
func TestCommittedMetadata(t *testing.T) {
	t.Parallel()
	b := testkit.Broker(t, 2)
	cfg := kafkautil.NewConfig("test-committed")
	client, err := sarama.NewClient([]string{b.Addr()}, cfg)
	require.NoError(t, err)
	defer client.Close()
	// A commit of a group with no members (generation -1), as a simple
	// consumer's.
	coordinator, err := client.Coordinator("g-committed")
	require.NoError(t, err)
	commit := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: "g-committed", ConsumerGroupGeneration: -1}
	commit.AddBlock("prompts", 0, 5, 0, "topic-id-a")
	resp, err := coordinator.CommitOffset(commit)
	require.NoError(t, err)
	require.Equal(t, sarama.ErrNoError, resp.Errors["prompts"][0])

	meta, err := kafkautil.CommittedMetadata(client, "g-committed")("prompts", []int32{0, 1})
	require.NoError(t, err)
	require.Equal(t, map[int32]string{0: "topic-id-a", 1: ""}, meta)
}
