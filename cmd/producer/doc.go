// Command producer publishes prompt envelopes to promptline's prompts topic
// and watches the session events promptline publishes back.
//
//	producer send --session s-1 --text "hello"
//	producer send --file prompts.jsonl
//	producer watch --session s-1 --type turn.completed
//
// Every keyed record goes through kafkautil's murmur2 partitioner by
// default, the Java client's and librdkafka's murmur2_random: producers in
// every language must agree on it, or one session's prompts land on several
// partitions. See docs/producers.md.
package main
