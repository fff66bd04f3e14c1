// Package client is promptline's Go client: what a Go service needs to
// publish prompts to promptline, answer its permission requests and follow
// its session events, with the settings docs/producers.md recommends.
//
//   - Producer publishes prompt envelopes (Send, SendBatch) and permission
//     replies (Reply) through Sarama's idempotent producer (acks=all),
//     keyed by session ID and partitioned with murmur2 as the Java client
//     does, after validating each value with the rules admission applies.
//   - Watcher follows the session-events topic, of one session or of all,
//     from the newest offsets, the oldest, an offset or a time; events
//     are published at least once, and the Watcher drops the repeats of an
//     event ID. With WatchOpts.Deltas it returns the live text deltas
//     (session-deltas) of the same sessions too.
//   - NewMurmur2Partitioner and Murmur2Partition are the Java-compatible
//     partitioner for programs that use plain Sarama.
//
// The commands of cmd/producer (send, watch, reply) are built on this
// package, so the command and the package cannot drift apart.
//
// A prompt is admitted once per message ID, however often it is sent:
// generate the ID once (NewMessageID) before the first attempt and reuse it
// on every retry, and a retry is an exact retry.
package client
