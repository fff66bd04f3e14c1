package pgdb_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

func TestTransient(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("doing something: %w", &pgconn.PgError{Code: code, Message: "x"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"TerminatedBackend", pg("57P01"), true},
		{"CrashShutdown", pg("57P02"), true},
		{"CannotConnectNow", pg("57P03"), true},
		{"LockTimeout", pg("55P03"), true},
		{"StatementTimeout", pg("57014"), true},
		{"Deadlock", pg("40P01"), true},
		{"SerializationFailure", pg("40001"), true},
		{"ConnectionException", pg("08006"), true},
		{"TooManyConnections", pg("53300"), true},
		{"ReadOnlyAfterFailover", pg("25006"), true},
		{"ConnClosed", fmt.Errorf("locking session: %w", pgconn.ErrConnClosed), true},
		{"NetError", fmt.Errorf("x: %w", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}), true},
		{"UnexpectedEOF", fmt.Errorf("x: %w", io.ErrUnexpectedEOF), true},
		{"Deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"JoinedWithLostRollback", errors.Join(pg("23505"), pgconn.ErrConnClosed), true},
		{"InvalidText", pg("22021"), false},
		{"UniqueViolation", pg("23505"), false},
		{"CheckViolation", pg("23514"), false},
		{"UndefinedColumn", pg("42703"), false},
		{"RaisedByFunction", pg("P0001"), false},
		{"InternalError", pg("XX000"), false},
		{"NoRows", pgx.ErrNoRows, false},
		{"OwnError", errors.New("continuation input belongs to session b"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, pgdb.Transient(tc.err), "%v", tc.err)
		})
	}
}

// Refused: only the errors after which the transaction certainly did not
// commit.
func TestRefused(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("setting phase continue: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "x"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"Nil", nil, false},
		{"Deadlock", pg("40P01"), true},
		{"SerializationFailure", pg("40001"), true},
		{"LockTimeout", pg("55P03"), true},
		{"DeadlockJoinedWithLostRollback", errors.Join(pg("40P01"), pgconn.ErrConnClosed), true},
		{"FatalDeadlock", fmt.Errorf("x: %w", &pgconn.PgError{Severity: "FATAL", Code: "40P01", Message: "x"}), false},
		// A server whose lc_messages is not English localizes Severity;
		// SeverityUnlocalized (PostgreSQL 9.6 on) is what counts.
		{"LocalizedDeadlock", fmt.Errorf("x: %w", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "40P01", Message: "x"}), true},
		{"LocalizedFatalDeadlock", fmt.Errorf("x: %w", &pgconn.PgError{Severity: "SCHWERWIEGEND", SeverityUnlocalized: "FATAL", Code: "40P01", Message: "x"}), false},
		{"CompletionUnknown", pg("40003"), false},
		{"TerminatedBackend", pg("57P01"), false},
		{"StatementTimeout", pg("57014"), false},
		{"ConnectionException", pg("08006"), false},
		{"ConnClosed", fmt.Errorf("committing: %w", pgconn.ErrConnClosed), false},
		{"UnexpectedEOF", fmt.Errorf("x: %w", io.ErrUnexpectedEOF), false},
		{"Deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"UniqueViolation", pg("23505"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, pgdb.Refused(tc.err), "%v", tc.err)
		})
	}
}

// The errors a real server and driver give, not only their codes.
func TestTransientFromServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)

	t.Run("StatementTimeout", func(t *testing.T) {
		t.Parallel()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = 10`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT pg_sleep(5)`)
		require.True(t, pgdb.Transient(err), "%v", err)
	})

	t.Run("TerminatedBackendAndTheClosedConnAfter", func(t *testing.T) {
		t.Parallel()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		var pid int
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT 1`)
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "%v", err)
		_, err = conn.Exec(ctx, `SELECT 1`)
		require.Error(t, err)
		require.True(t, pgdb.Transient(err), "%v", err)
	})

	t.Run("DataErrorIsDeterministic", func(t *testing.T) {
		t.Parallel()
		_, err := pool.Exec(ctx, `SELECT $1::text`, "a\x00b")
		require.Error(t, err)
		require.False(t, pgdb.Transient(err), "%v", err)
	})
}
