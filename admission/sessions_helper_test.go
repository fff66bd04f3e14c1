package admission_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// poolWithSessions is a fresh database holding the sessions named: the
// rows admission's own writes lock and point at.
func poolWithSessions(t *testing.T, sessions ...string) *pgxpool.Pool {
	t.Helper()
	pool, _ := testkit.Pool(t)
	for _, s := range sessions {
		_, err := pool.Exec(context.Background(), `INSERT INTO sessions (session_id) VALUES ($1)`, s)
		require.NoError(t, err)
	}
	return pool
}
