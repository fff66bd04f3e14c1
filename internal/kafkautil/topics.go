package kafkautil

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
)

// Topics names promptline's topics. Zero fields take the defaults.
type Topics struct {
	// Prompts carries prompt envelopes in, key = session ID. Defaults to "prompts".
	Prompts string
	// Wakes carries internal wake hints, key = session ID. Defaults to "wakes".
	Wakes string
	// Events carries session events out, key = session ID. Defaults to "session-events".
	Events string
	// Rejects carries bad input: original bytes, reason and source in headers. Defaults to "prompts.rejects".
	Rejects string
	// PermissionReplies carries replies to permission requests, key =
	// session ID. Defaults to "permission-replies".
	PermissionReplies string
	// Deltas carries live text deltas of streaming providers out, key =
	// session ID; not durable (docs/session-events.md, "Live deltas").
	// Defaults to "session-deltas".
	Deltas string
}

// WithDefaults fills unset names.
func (t Topics) WithDefaults() Topics {
	t.Prompts = cmp.Or(t.Prompts, "prompts")
	t.Wakes = cmp.Or(t.Wakes, "wakes")
	t.Events = cmp.Or(t.Events, "session-events")
	t.Rejects = cmp.Or(t.Rejects, "prompts.rejects")
	t.PermissionReplies = cmp.Or(t.PermissionReplies, "permission-replies")
	t.Deltas = cmp.Or(t.Deltas, "session-deltas")
	return t
}

// All lists every topic.
func (t Topics) All() []string {
	return []string{t.Prompts, t.Wakes, t.Events, t.Rejects, t.PermissionReplies, t.Deltas}
}

// TopicConfig is the configuration EnsureTopics creates every topic with
// (docs/deploy.md, "Kafka: topics", lists it and a test compares the two):
// never compacted, whatever the broker's log.cleanup.policy (compaction
// would keep only the last prompt of a session, and replay needs them
// all), and with three replicas or more min.insync.replicas=2, so that an
// acks=all write is on two brokers before it is acknowledged (the broker's
// default is 1). Everything else (retention.ms, max.message.bytes) is the
// broker's default.
func TopicConfig(replication int16) map[string]*string {
	c := map[string]*string{"cleanup.policy": ptr("delete")}
	if replication >= 3 {
		c["min.insync.replicas"] = ptr("2")
	}
	return c
}

func ptr(s string) *string { return &s }

// EnsureTopics creates the topics that do not exist yet, with the given
// partition count and TopicConfig, and returns the names it created. Existing topics are left
// as they are; a partition-count mismatch between prompts and wakes is
// logged, because it costs partition affinity (never correctness: the
// Postgres claim keeps one writer per session).
func EnsureTopics(admin sarama.ClusterAdmin, t Topics, partitions int32, replication int16, log *slog.Logger) ([]string, error) {
	existing, err := admin.ListTopics()
	if err != nil {
		return nil, fmt.Errorf("listing topics: %w", err)
	}
	var created []string
	for _, name := range t.All() {
		if _, ok := existing[name]; ok {
			continue
		}
		err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: replication,
			ConfigEntries: TopicConfig(replication)}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			var te *sarama.TopicError
			if !errors.As(err, &te) || te.Err != sarama.ErrTopicAlreadyExists {
				return created, fmt.Errorf("creating topic %s: %w", name, err)
			}
		}
		created = append(created, name)
	}
	if len(created) > 0 {
		if err := awaitLeaders(admin, created, topicLeadersTimeout); err != nil {
			return created, err
		}
	}
	if p, w := existing[t.Prompts], existing[t.Wakes]; p.NumPartitions != 0 && w.NumPartitions != 0 && p.NumPartitions != w.NumPartitions && log != nil {
		log.Warn("prompts and wakes differ in partition count: sessions lose partition affinity",
			slog.String("prompts", t.Prompts), slog.Int("prompts_partitions", int(p.NumPartitions)),
			slog.String("wakes", t.Wakes), slog.Int("wakes_partitions", int(w.NumPartitions)))
	}
	return created, nil
}

// topicLeadersTimeout bounds the wait for a created topic's leaders.
const topicLeadersTimeout = 30 * time.Second

// awaitLeaders waits until every partition of topics has a leader. Apache
// Kafka (KRaft) answers CreateTopics once the controller has recorded the
// topic; the brokers take the leadership a moment later, and a client that
// reads or writes before that gets NOT_LEADER_OR_FOLLOWER (the embedded
// broker creates topics with their leader at once).
func awaitLeaders(admin sarama.ClusterAdmin, topics []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		metas, err := admin.DescribeTopics(topics)
		if err == nil {
			err = leaderless(metas)
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for the leaders of %v: %w", topics, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func leaderless(metas []*sarama.TopicMetadata) error {
	for _, m := range metas {
		if m.Err != sarama.ErrNoError {
			return fmt.Errorf("topic %s: %w", m.Name, m.Err)
		}
		if len(m.Partitions) == 0 {
			return fmt.Errorf("topic %s: no partitions yet", m.Name)
		}
		for _, p := range m.Partitions {
			if p.Err != sarama.ErrNoError || p.Leader < 0 {
				return fmt.Errorf("topic %s partition %d: no leader yet", m.Name, p.ID)
			}
		}
	}
	return nil
}

// PartitionCount returns a function that asks the cluster, through client,
// how many partitions topic has, refreshing the metadata first (partitions
// may have been added since the last call).
func PartitionCount(client sarama.Client, topic string) func() (int32, error) {
	return func() (int32, error) {
		if err := client.RefreshMetadata(topic); err != nil {
			return 0, fmt.Errorf("reading the partitions of %s: %w", topic, err)
		}
		ps, err := client.Partitions(topic)
		if err != nil {
			return 0, fmt.Errorf("reading the partitions of %s: %w", topic, err)
		}
		return int32(len(ps)), nil
	}
}

// TopicIDs returns a function that asks the cluster, through client, for
// the ID of each of topics: the UUID Kafka gives a topic when it creates
// it, a new one for a topic deleted and created again under the same name
// (the name alone cannot tell the two apart, nor can an offset). A topic
// the cluster does not know, or whose metadata came with an error, is left
// out of the map.
func TopicIDs(client sarama.Client) func(topics []string) (map[string]sarama.Uuid, error) {
	return func(topics []string) (map[string]sarama.Uuid, error) {
		b := client.LeastLoadedBroker()
		if b == nil {
			return nil, fmt.Errorf("reading the IDs of %v: %w", topics, sarama.ErrOutOfBrokers)
		}
		resp, err := b.GetMetadata(sarama.NewMetadataRequest(client.Config().Version, topics))
		if err != nil {
			return nil, fmt.Errorf("reading the IDs of %v: %w", topics, err)
		}
		ids := make(map[string]sarama.Uuid, len(topics))
		for _, t := range resp.Topics {
			if t.Err == sarama.ErrNoError && t.Uuid != (sarama.Uuid{}) {
				ids[t.Name] = t.Uuid
			}
		}
		return ids, nil
	}
}

// OldestOffset returns a function that asks the cluster, through client,
// for the first offset a partition still holds.
func OldestOffset(client sarama.Client) func(topic string, partition int32) (int64, error) {
	return func(topic string, partition int32) (int64, error) {
		o, err := client.GetOffset(topic, partition, sarama.OffsetOldest)
		if err != nil {
			return 0, fmt.Errorf("reading the oldest offset of %s/%d: %w", topic, partition, err)
		}
		return o, nil
	}
}

// CommittedMetadata returns a function that asks group's coordinator,
// through client, for the metadata committed with the offsets of a
// topic's partitions: "" for a partition with no commit or none with
// metadata.
func CommittedMetadata(client sarama.Client, group string) func(topic string, partitions []int32) (map[int32]string, error) {
	return func(topic string, partitions []int32) (map[int32]string, error) {
		coordinator, err := client.Coordinator(group)
		if err != nil {
			return nil, fmt.Errorf("finding the coordinator of group %s: %w", group, err)
		}
		req := sarama.NewOffsetFetchRequest(client.Config().Version, group, map[string][]int32{topic: partitions})
		resp, err := coordinator.FetchOffset(req)
		if err != nil {
			return nil, fmt.Errorf("reading the committed offsets of %s in group %s: %w", topic, group, err)
		}
		kerr := resp.Err
		if resp.Version >= 8 && len(resp.Groups) > 0 {
			kerr = resp.Groups[0].Err
		}
		if kerr != sarama.ErrNoError {
			return nil, fmt.Errorf("reading the committed offsets of %s in group %s: %w", topic, group, kerr)
		}
		out := make(map[int32]string, len(partitions))
		for _, p := range partitions {
			b := resp.GetBlock(topic, p)
			switch {
			case b == nil:
			case b.Err != sarama.ErrNoError:
				return nil, fmt.Errorf("reading the committed offset of %s/%d in group %s: %w", topic, p, group, b.Err)
			default:
				out[p] = b.Metadata
			}
		}
		return out, nil
	}
}
