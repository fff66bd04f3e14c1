// Package pipeline feeds promptline's rooms from Kafka: Consumer is the
// Sarama consumer-group handler of the prompts, wakes and
// permission-replies topics. It hands prompts and replies to admission
// (package admission), in batches, and wakes to the session executor
// (package executor); malformed messages go to the rejects topic. The
// provider contract is in package provider.
//
// When the process that admitted a prompt also owns its session's wakes
// partition, the consumer starts the session at once, right after the
// commit (a local wake, executor's local_wakes.go); the wake from Kafka is
// then recognised and joins that run.
//
// Consumer uses Sarama's ConsumerGroupHandler directly rather than
// watermill-kafka: admission needs the messages of a partition in batches
// (watermill-kafka acknowledges one at a time), and the executor needs to
// know which partitions this process owns (Setup/Cleanup), which
// watermill-kafka does not expose.
package pipeline
