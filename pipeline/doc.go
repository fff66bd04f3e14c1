// Package pipeline is promptline's straight path: admission (prompts from
// Kafka into Postgres, exactly once, with an outbox wake in the same
// transaction) and execution (the session's executor promotes waiting
// inputs, calls the provider, stores the answer and announces it through
// the outbox).
//
// Consumer is the Sarama consumer-group handler that feeds both from the
// prompts and wakes topics. It uses Sarama's ConsumerGroupHandler directly
// rather than watermill-kafka: admission needs the messages of a partition
// in batches (watermill-kafka acknowledges one at a time), and the executor
// needs to know which partitions this process owns (Setup/Cleanup), which
// watermill-kafka does not expose.
package pipeline
