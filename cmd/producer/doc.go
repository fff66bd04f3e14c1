// Command producer publishes prompt envelopes to promptline's prompts topic,
// answers permission requests and watches the session events promptline
// publishes back. It is built on package client, so that the command and
// the Go package cannot drift apart.
//
//	producer send --session s-1 --text "hello"
//	producer send --file prompts.jsonl
//	producer watch --session s-1 --type turn.completed
//	producer reply --session s-1 --request R once
//
// Every keyed record goes through the murmur2 partitioner by
// default, the Java client's and librdkafka's murmur2_random: producers in
// every language must agree on it, or one session's prompts land on several
// partitions. See docs/producers.md.
package main
