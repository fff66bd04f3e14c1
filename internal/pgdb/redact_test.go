package pgdb_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// TestOpenErrorHidesPassword: an unparsable database URL is printed on
// stderr at start; pgx masks the password only up to its first '@'.
func TestOpenErrorHidesPassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://app:se@cret@db.internal/promptline?sslmode=bogus",
		"postgres://app:se/cret@db.internal:99999/promptline",
		"host=db.internal password=secret sslmode=bogus",
	} {
		_, err := pgdb.Open(context.Background(), pgdb.OpenOpts{URL: u})
		require.Error(t, err, u)
		require.Contains(t, err.Error(), "--database-url", u)
		require.NotContains(t, err.Error(), "cret", u)
	}
}
