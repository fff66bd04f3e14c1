package kafkautil

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"

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
}

// WithDefaults fills unset names.
func (t Topics) WithDefaults() Topics {
	t.Prompts = cmp.Or(t.Prompts, "prompts")
	t.Wakes = cmp.Or(t.Wakes, "wakes")
	t.Events = cmp.Or(t.Events, "session-events")
	t.Rejects = cmp.Or(t.Rejects, "prompts.rejects")
	t.PermissionReplies = cmp.Or(t.PermissionReplies, "permission-replies")
	return t
}

// All lists every topic.
func (t Topics) All() []string {
	return []string{t.Prompts, t.Wakes, t.Events, t.Rejects, t.PermissionReplies}
}

// EnsureTopics creates the topics that do not exist yet, with the given
// partition count, and returns the names it created. Existing topics are left
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
		err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: replication}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			var te *sarama.TopicError
			if !errors.As(err, &te) || te.Err != sarama.ErrTopicAlreadyExists {
				return created, fmt.Errorf("creating topic %s: %w", name, err)
			}
		}
		created = append(created, name)
	}
	if p, w := existing[t.Prompts], existing[t.Wakes]; p.NumPartitions != 0 && w.NumPartitions != 0 && p.NumPartitions != w.NumPartitions && log != nil {
		log.Warn("prompts and wakes differ in partition count: sessions lose partition affinity",
			slog.String("prompts", t.Prompts), slog.Int("prompts_partitions", int(p.NumPartitions)),
			slog.String("wakes", t.Wakes), slog.Int("wakes_partitions", int(w.NumPartitions)))
	}
	return created, nil
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
