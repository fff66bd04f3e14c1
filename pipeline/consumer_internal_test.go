package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Only deterministic data errors (SQLSTATE class 22 and 23) are data
// errors; what a retry may fix never is, wrapped or not.
func TestIsDataError(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{
		"22021": true,  // character not in repertoire (U+0000)
		"22001": true,  // string data right truncation
		"22P02": true,  // invalid text representation
		"23505": true,  // unique violation
		"23514": true,  // check violation
		"23503": true,  // foreign key violation
		"40001": false, // serialization failure
		"40P01": false, // deadlock
		"55P03": false, // lock not available (lock_timeout)
		"57014": false, // query canceled (statement_timeout)
		"57P01": false, // admin shutdown (pg_terminate_backend, failover)
		"08006": false, // connection failure
		"42501": false, // insufficient privilege: an operator can grant it
		"53100": false, // disk full
		"":      false,
	} {
		err := fmt.Errorf("admitting 3 prompts: %w", &pgconn.PgError{Code: code, Message: "m"})
		require.Equal(t, want, isDataError(err), code)
	}
	require.False(t, isDataError(nil))
	require.False(t, isDataError(io.ErrUnexpectedEOF), "a lost connection")
	require.False(t, isDataError(context.DeadlineExceeded))
	require.False(t, isDataError(errors.New("22021")), "only a Postgres error says so")
}
