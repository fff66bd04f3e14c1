package ledger

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// interpretError maps what the driver says, wrapped or not, to the
// ledger's sentinels, and hands every other error back unchanged.
func TestInterpretError(t *testing.T) {
	t.Parallel()
	require.NoError(t, interpretError(nil))
	require.ErrorIs(t, interpretError(pgx.ErrNoRows), errNotFound)
	require.ErrorIs(t, interpretError(fmt.Errorf("reading: %w", pgx.ErrNoRows)), errNotFound)
	require.ErrorIs(t, interpretError(fmt.Errorf("batch: %w", &pgconn.PgError{Code: fencedCode})), errFenceRaised)
	require.ErrorIs(t, interpretError(&pgconn.PgError{Code: staleCode}), errStaleRaised)
	for _, err := range []error{
		&pgconn.PgError{Code: "23505", Message: "duplicate key"},
		&pgconn.PgError{Code: "40001"},
		errors.New("PLFEN"),
		ErrFenced,
	} {
		require.Same(t, err, interpretError(err), "%v", err)
	}
}
