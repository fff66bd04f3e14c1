package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// Admission locks its batch's sessions in byte order, whatever the
// database's collation: the order in which a combined transaction of the
// ledger's group commit locks its sessions (sorted as Go sorts strings).
// Ordered by the database's collation instead (en-US puts 'a' before 'B',
// byte order 'B' before 'a'), an admission batch and a combined flush could
// each hold one of two sessions and wait for the other's, until the
// deadlock detector refused one.
//
// The test databases are created with the C collation, where both orders
// agree, and the tests' role may not create a database of another: so the
// statement is held to its COLLATE "C", and the order is checked with 'B'
// and 'a' (a database collated en-US would fail the second part with the
// collation's order).
func TestAdmissionLocksSessionsInByteOrder(t *testing.T) {
	t.Parallel()
	require.Contains(t, lockSessionsSQL, `SELECT DISTINCT c.s COLLATE "C" FROM c`,
		"the sessions are upserted, and so locked, in byte order")

	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO sessions (session_id) VALUES ('a'), ('B')`)
	require.NoError(t, err)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'a' FOR UPDATE`)
	require.NoError(t, err)

	admitted := make(chan error, 1)
	go func() {
		_, err := NewAdmitter(pool, &AdmitterConfig{}).Admit(ctx, []Incoming{prompt("m-a", "a", "x", true), prompt("m-B", "B", "x", true)})
		admitted <- err
	}()
	require.Eventually(t, func() bool {
		return testkit.Count(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`) == 1
	}, 10*time.Second, 10*time.Millisecond, "admission waits for 'a'")

	// 'B' came first: admission holds it while it waits for 'a'.
	probe, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = probe.Rollback(ctx) }()
	_, err = probe.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = 'B' FOR UPDATE NOWAIT`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "55P03", "'B' is locked by admission before 'a': %v", err)
	require.NoError(t, probe.Rollback(ctx))

	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-admitted)
}
