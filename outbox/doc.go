// Package outbox is promptline's transactional outbox. Writers call Insert
// inside the transaction of the state change a message announces; the Relay
// publishes committed rows to Kafka at least once, in order per key, and
// marks them published. A row no broker will ever take (too large for its
// topic, a topic that does not exist) is quarantined with its reason, and
// the rows after it go on; a transient failure is retried and quarantines
// nothing (docs/design.md, invariant 13). The Pruner deletes published rows
// older than the retention.
package outbox
