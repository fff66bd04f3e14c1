package admission

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
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

// The reject of a data error names the SQLSTATE and the server's message,
// cut to maxRejectDetail bytes of valid UTF-8: live admission and replay
// publish the same.
func TestDataErrorReject(t *testing.T) {
	t.Parallel()
	de, ok := AsDataError(&pgconn.PgError{Code: "23514", Message: `new row for relation "inputs" violates check constraint "c"`})
	require.True(t, ok)
	re := de.Reject()
	require.Equal(t, envelope.ReasonDataError, re.Reason)
	require.Equal(t, `Postgres refused it: SQLSTATE 23514: new row for relation "inputs" violates check constraint "c"`, re.Detail)

	de, ok = AsDataError(&pgconn.PgError{Code: "22001", Message: strings.Repeat("é", 200)})
	require.True(t, ok)
	re = de.Reject()
	require.LessOrEqual(t, len(re.Detail), maxRejectDetail)
	require.Greater(t, len(re.Detail), maxRejectDetail-2)
	require.True(t, utf8.ValidString(re.Detail))
	require.True(t, strings.HasPrefix(re.Detail, "Postgres refused it: SQLSTATE 22001: éé"))
}
