package client

import (
	"github.com/IBM/sarama"

	"github.com/promptline/promptline/internal/kafkautil"
)

// NewMurmur2Partitioner is the partitioner of the Java client (and of
// librdkafka's murmur2_random, and kafkajs's DefaultPartitioner): a keyed
// record goes to (murmur2(key) & 0x7fffffff) % partitions, an unkeyed one
// to a random partition. Sarama's default (FNV-1a) disagrees, and so does
// its custom-hash partitioner with a murmur2 hasher (it takes the absolute
// value instead of masking the sign bit). Programs that publish to
// promptline with plain Sarama set
//
//	config.Producer.Partitioner = client.NewMurmur2Partitioner
//
// so that a session's records land on the partition every other producer
// chooses, the one whose owner is the session's home.
func NewMurmur2Partitioner(topic string) sarama.Partitioner {
	return kafkautil.NewMurmur2Partitioner(topic)
}

// Murmur2Partition is the partition of key among n partitions, as the Java
// client computes it.
func Murmur2Partition(key []byte, n int32) int32 { return kafkautil.Murmur2Partition(key, n) }
