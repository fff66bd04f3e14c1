// Package pipeline is promptline's path from a prompt to its answer:
// admission (prompts and permission replies from Kafka into Postgres,
// exactly once, with an outbox wake in the same transaction; Admitter) and
// execution (the session's Executor claims the session, promotes waiting
// inputs, calls the Provider step by step, runs tool calls under their
// permission policy, parks a turn on a permission ask and resumes it with
// the reply, takes recovery's continuations up, stores the answer and
// announces it through the outbox). The Provider contract and its error
// classes are in package provider; the network providers in
// provider/providers.
//
// When the process that admitted a prompt also owns its session's wakes
// partition, it starts the session at once (a local wake, hint.go); the
// wake from Kafka is then recognised and joins that run.
//
// Consumer is the Sarama consumer-group handler that feeds both from the
// prompts and wakes topics. It uses Sarama's ConsumerGroupHandler directly
// rather than watermill-kafka: admission needs the messages of a partition
// in batches (watermill-kafka acknowledges one at a time), and the executor
// needs to know which partitions this process owns (Setup/Cleanup), which
// watermill-kafka does not expose.
package pipeline
