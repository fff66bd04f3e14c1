// Package examples holds what promptline's users write around it, as the
// docs show them, with the tests that run them against the embedded
// broker: producers of prompt envelopes in other languages (java/ publishes
// with kafka-clients, the reference partitioner; python/ with
// confluent-kafka; node/ with kafkajs; see docs/producers.md), and
// watermill/, a Go service that
// consumes session events with Watermill and deduplicates them on their id
// (see docs/session-events.md).
package examples
