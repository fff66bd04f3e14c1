package admission

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A data error keeps the server's code and message for the reject, and
// the admission's error as its text and chain; nothing else is one.
func TestAsDataError(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Code: "22021", Message: "invalid byte sequence"}
	err := fmt.Errorf("admitting 3 prompts: %w", pgErr)
	de, ok := AsDataError(err)
	require.True(t, ok)
	require.Equal(t, "22021", de.Code)
	require.Equal(t, "invalid byte sequence", de.Message)
	require.Equal(t, err.Error(), de.Error())
	require.ErrorIs(t, de, pgErr)

	for _, err := range []error{nil, pgx.ErrNoRows, errors.New("22021"), &pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "2"}} {
		de, ok := AsDataError(err)
		require.False(t, ok, "%v", err)
		require.Nil(t, de)
	}
	require.ErrorIs(t, interpretError(fmt.Errorf("reading: %w", pgx.ErrNoRows)), errNotFound)
	other := errors.New("other")
	require.Same(t, other, interpretError(other))
}
