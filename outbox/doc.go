// Package outbox is promptline's transactional outbox. Writers call Insert
// inside the transaction of the state change a message announces; the Relay
// publishes committed rows to Kafka at least once, in order per key, and
// marks them published.
package outbox
