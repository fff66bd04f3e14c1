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
// retrying, and Refused (they translate nothing: each owner package
// translates the driver errors of its statements, pgx.ErrNoRows and the
// SQLSTATEs it cares about, in its errors.go's interpretError, and no
// other code of the module looks at them: docs/design.md, Table owners);
// Time, a timestamptz read as the column holds it, '-infinity' and
// 'infinity' included, for the reads one odd row must not fail; and, in
// builds with the faults tag, the commit tracer of the crash
// sweep.
package pgdb
