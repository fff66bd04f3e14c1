// Package kafkautil is promptline's shared Kafka plumbing over Sarama: client
// configuration, the Java-compatible murmur2 partitioner, topic creation and
// the embedded Kafka-protocol broker (franz-go's kfake on a TCP listener)
// used for development, demos and tests. Everything outside the embedded
// broker itself talks Kafka through Sarama over TCP.
package kafkautil
