package pgdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
)

// Migration 00023 drops two UNIQUE constraints under an ACCESS EXCLUSIVE
// lock, which waits behind any transaction on the table while every write
// after it queues behind the wait. Its wait is bounded: behind a
// transaction that holds inputs, it gives up with lock_not_available
// within its bound and changes nothing; once that transaction ends it
// runs, and it runs again over itself.
func TestSequenceUniquesMigrationWaitsBoundedAndRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const schema = "rerun_sequence_uniques"
	db, url, rerun := migratedToURL(t, schema, 23)
	// As if it had never run: the constraints back, unrecorded.
	for _, sql := range []string{
		`ALTER TABLE inputs ADD CONSTRAINT inputs_promotion_seq_key UNIQUE (promotion_seq)`,
		`ALTER TABLE messages ADD CONSTRAINT messages_seq_key UNIQUE (seq)`,
	} {
		_, err := db.ExecContext(ctx, sql)
		require.NoError(t, err, sql)
	}
	both := []string{"inputs_promotion_seq_key", "messages_seq_key"}
	require.Equal(t, both, indexes(t, db, schema, true, both...))

	// A reader of inputs with its transaction open.
	holder, err := db.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	tx, err := holder.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `SELECT count(*) FROM inputs`)
	require.NoError(t, err)

	// A consumer's start migrates through its pool (pgdb.MigratePool).
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	start := time.Now()
	bounded, cancel := context.WithTimeout(ctx, 15*time.Second) // without its bound, it would wait for good
	defer cancel()
	err = pgdb.MigratePool(bounded, pool)
	waited := time.Since(start)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "%v", err)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available: %v", err)
	require.ErrorContains(t, err, "run `consumer migrate` again", "with the operator's advice")
	require.GreaterOrEqual(t, waited, 2*time.Second, "it waited its bound")
	require.Less(t, waited, 10*time.Second, "and no longer: the bound is the migration's own (this connection has no lock_timeout)")
	require.Equal(t, both, indexes(t, db, schema, true, both...), "nothing changed")
	v, err := pgdb.SchemaVersion(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 22, v)

	require.NoError(t, tx.Rollback())
	rerun()
	require.Empty(t, indexes(t, db, schema, true, both...), "both dropped")
	_, err = db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id = 23`)
	require.NoError(t, err)
	rerun()
	require.Empty(t, indexes(t, db, schema, true, both...))
}
