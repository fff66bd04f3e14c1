// Package pgdb opens promptline's Postgres: it resolves the database URL
// (flag, DATABASE_URL, the default local server, or the local cluster
// started from the machine's PostgreSQL binaries and kept for the next
// process: local.go), warns when a remote
// connection is not encrypted, applies the embedded, numbered migrations
// under an advisory lock and refuses a schema newer than the binary
// (SchemaVersionError).
//
// It also holds what every package shares about running statements: the
// transaction helpers (InTx, InTxFrom, whose rollback outlives a cancelled
// caller); Transient, the one rule that classifies a driver error as worth
// retrying (it classifies and translates nothing: callers wrap driver
// errors and check pgx.ErrNoRows themselves); and, in builds with the
// faults tag, the commit tracer of the crash sweep.
package pgdb
