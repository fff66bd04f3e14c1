// Package testkit gives tests a real Postgres database and a real
// Kafka-protocol broker over TCP.
//
// Postgres: DATABASE_URL when set, else the server on 127.0.0.1:5432 (libpq's
// default user), else a throwaway cluster started once per test binary from
// the machine's PostgreSQL binaries. Each test gets a fresh database cloned
// from a migrated template (pgtestdb). Packages that use it call Main from
// TestMain, which also stops the throwaway cluster and checks for leaked
// goroutines.
//
// Also: Count, SessionEvents and Snapshot, to read what a test's
// database holds;
// the pieces a test bundle of the running pipeline is built from
// (KafkaClient to produce and run a consumer group, TopicReader to read a
// topic as it fills, Logger, Counts for a config's callbacks);
// EventSchema and DeltaSchema, the published schemas compiled once;
// PlanConn, for tests of query plans; SyncBuffer, a process's output that
// a test waits on; the one-time setup of the producer examples in other
// languages (examples.go); and, in pgproxy, a Postgres-aware TCP proxy
// that injects database faults (cuts, stalls, the ambiguous commit).
package testkit
