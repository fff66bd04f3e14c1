package kafkautil

import (
	"fmt"

	"github.com/IBM/sarama"
)

// Partitioner names accepted by NewPartitioner (the --partitioner flag).
const (
	PartitionerMurmur2 = "murmur2" // Java client default, librdkafka murmur2_random
	PartitionerFNV1a   = "fnv1a"   // Sarama's default hash partitioner
)

// NewPartitioner returns the Sarama partitioner constructor for name.
func NewPartitioner(name string) (sarama.PartitionerConstructor, error) {
	switch name {
	case PartitionerMurmur2, "":
		return NewMurmur2Partitioner, nil
	case PartitionerFNV1a:
		return sarama.NewHashPartitioner, nil
	default:
		return nil, fmt.Errorf("unknown partitioner %q: want %q or %q", name, PartitionerMurmur2, PartitionerFNV1a)
	}
}

// NewMurmur2Partitioner is the partitioner of the Java client (and of
// librdkafka's murmur2_random): keyed messages go to
// (murmur2(key) & 0x7fffffff) % partitions. Sarama ships only FNV-1a and
// CRC32 hashers, and its custom-hash partitioner takes the absolute value
// instead of masking the sign bit, which lands some keys elsewhere; hence
// this small implementation, checked against Kafka's own test vectors.
// Producers in every language must agree on it, or a session's prompts split
// across partitions and lose their home process.
func NewMurmur2Partitioner(topic string) sarama.Partitioner {
	return murmur2Partitioner{random: sarama.NewRandomPartitioner(topic)}
}

type murmur2Partitioner struct{ random sarama.Partitioner }

func (p murmur2Partitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	if msg.Key == nil {
		return p.random.Partition(msg, numPartitions)
	}
	key, err := msg.Key.Encode()
	if err != nil {
		return -1, err
	}
	return Murmur2Partition(key, numPartitions), nil
}

func (murmur2Partitioner) RequiresConsistency() bool { return true }

// Murmur2Partition is the partition of key among n partitions, as the Java
// client computes it.
func Murmur2Partition(key []byte, n int32) int32 {
	return int32(Murmur2(key)&0x7fffffff) % n
}

// Murmur2 is Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2).
func Murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	length := len(data)
	h := uint32(seed) ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := length &^ 3
	switch length % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
