package pgdb

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// transientCodes are the SQLSTATEs that say nothing about the statement or
// its data: the same statement may succeed when run again (docs/design.md,
// invariant 13: retried, never quarantined).
var transientCodes = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"40003": true, // statement_completion_unknown
	"55P03": true, // lock_not_available (lock_timeout, NOWAIT)
	"55006": true, // object_in_use
	"57014": true, // query_canceled (statement_timeout, a cancel request)
	"57P01": true, // admin_shutdown (pg_terminate_backend, a failover, a pooler restart)
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now (the server is starting or in recovery)
	"25006": true, // read_only_sql_transaction (reached a demoted primary during a failover)
	"58000": true, // system_error
	"58030": true, // io_error
	"72000": true, // snapshot_too_old
}

// transientClasses are whole SQLSTATE classes that are transient.
var transientClasses = map[string]bool{
	"08": true, // connection exception
	"53": true, // insufficient resources (too many connections, out of memory, disk full)
}

// Transient reports whether err is one that running the same work again may
// cure: a lost or refused connection, a timeout (lock_timeout,
// statement_timeout, a deadline), a deadlock, a serialization failure, a
// server shutting down or out of resources. Such an error says nothing
// about the row being worked on: the caller retries (or leaves the row for
// its next pass) and never quarantines or rejects because of it. Every
// other error — a data error (class 22), a constraint violation (class 23),
// an error raised by a function, an error of promptline's own — is
// deterministic: the same input fails the same way again.
//
// This is the one rule; callers in every package use it.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if transientCodes[pgErr.Code] {
			return true
		}
		if len(pgErr.Code) == 5 && transientClasses[pgErr.Code[:2]] {
			return true
		}
		// A server error that is not transient may still be joined with a
		// lost connection (a rollback that failed): fall through.
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// Nothing about the row: the caller ran out of time or is stopping.
		return true
	}
	return false
}

// refusedCodes are the transient SQLSTATEs with which the server refuses a
// transaction of its own accord: it rolled the transaction back, whichever
// statement (COMMIT included) received the error.
var refusedCodes = map[string]bool{
	"40001": true, // serialization_failure
	"40P01": true, // deadlock_detected
	"55P03": true, // lock_not_available (lock_timeout, NOWAIT)
}

// Refused reports whether err says that the server refused the transaction
// (a deadlock, a serialization failure, a lock not granted in time), so
// that the transaction certainly did not commit and running it again is
// safe even for a write that is not idempotent. Every other transient
// error may have cut the connection during COMMIT (or, like 57P01 during a
// synchronous commit's wait, arrived after the commit): the commit is then
// in doubt, and Refused is false. Only an ERROR counts: a FATAL with one of
// these codes (a hot standby's recovery conflict) ends the session, and
// what it says of a COMMIT is not vouched for here.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && IsError(pgErr) && refusedCodes[pgErr.Code]
}

// IsError reports whether the server sent pgErr with severity ERROR (it
// ended the statement and the transaction, not the session), read from
// the severity that is never localized (PostgreSQL 9.6 on) when the
// server sent it: under an lc_messages other than English the other
// one reads "FEHLER" or "ERREUR".
func IsError(pgErr *pgconn.PgError) bool {
	return cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR"
}
