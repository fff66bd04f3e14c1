package pgdb_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/testkit"
)

// A transaction whose function panics, or ends its goroutine
// (runtime.Goexit), is rolled back and its connection goes back to the
// pool: the executor recovers what its own code panics with and goes on,
// and a connection left acquired mid-transaction would be lost to the
// pool for good (the pool empties one panic at a time, and the rows the
// transaction locked stay locked).
//
// It catches: InTx or InTxFrom leaving the transaction open when fn does
// not return.
func TestTransactionEndsWhenItsFunctionDoesNotReturn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opened, err := pgdb.Open(ctx, pgdb.OpenOpts{URL: testkit.DatabaseURL(t)})
	require.NoError(t, err)
	db := opened.Pool
	t.Cleanup(func() {
		// A connection left acquired would hold Close forever: the failure
		// is reported, the pool left to the test process's end.
		if db.Stat().AcquiredConns() == 0 {
			_ = opened.Close()
		}
	})
	_, err = db.Exec(ctx, `CREATE TABLE tx_panic (id int PRIMARY KEY)`)
	require.NoError(t, err)

	begins := map[string]func(fn func(pgx.Tx) error) error{
		"InTx": func(fn func(pgx.Tx) error) error { return pgdb.InTx(ctx, db, fn) },
		"InTxFrom": func(fn func(pgx.Tx) error) error {
			first := &pgx.Batch{}
			first.Queue(`SELECT 1`)
			return pgdb.InTxFrom(ctx, db, first, fn)
		},
	}
	ends := map[string]func(){
		"Panic":  func() { panic("a bug in the transaction's function") },
		"Goexit": runtime.Goexit,
	}
	// A callback of InTxFrom's first statements that does not return.
	for ename, end := range ends {
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { _ = recover() }()
			first := &pgx.Batch{}
			first.Queue(`SELECT 1`).Exec(func(pgconn.CommandTag) error { end(); return nil })
			_ = pgdb.InTxFrom(ctx, db, first, func(pgx.Tx) error { return nil })
		}()
		<-done
		// The connection, busy mid-batch, is closed rather than kept:
		// the pool destroys it on a goroutine of its own.
		require.Eventually(t, func() bool { return db.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond,
			"InTxFrom's first callback, %s: the connection was given back", ename)
	}
	id := 0
	for bname, begin := range begins {
		for ename, end := range ends {
			id++
			row := id
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer func() { _ = recover() }()
				_ = begin(func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO tx_panic VALUES ($1)`, row); err != nil {
						return err
					}
					end()
					return nil
				})
			}()
			<-done
			require.Zero(t, db.Stat().AcquiredConns(), "%s, %s: the connection went back to the pool", bname, ename)
			var n int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM tx_panic WHERE id = $1`, row).Scan(&n))
			require.Zero(t, n, "%s, %s: nothing of the transaction committed", bname, ename)
			// The row is not locked by a transaction left open: a write of
			// the same key passes at once.
			require.NoError(t, pgdb.InTx(ctx, db, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO tx_panic VALUES ($1)`, row)
				return err
			}), "%s, %s", bname, ename)
		}
	}
}

// A transaction that cannot begin (no connection to be had: the database
// away) returns the error, with or without a deadline on its context.
// InTxFrom's batch then has a transaction with no connection behind it,
// which the bound on its statements (boundStatements) must not reach
// for: that was a nil dereference, a panic in admission whenever the
// database was away.
func TestTransactionWithoutAConnectionReturnsTheError(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: every connect is refused at once.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ran := false
	first := &pgx.Batch{}
	first.Queue(`SELECT 1`)
	err = pgdb.InTxFrom(ctx, pool, first, func(pgx.Tx) error { ran = true; return nil })
	require.Error(t, err, "InTxFrom")
	require.False(t, ran, "InTxFrom ran its function")
	err = pgdb.InTx(ctx, pool, func(pgx.Tx) error { ran = true; return nil })
	require.Error(t, err, "InTx")
	require.False(t, ran, "InTx ran its function")
}

// endsContext is a query rewriter that ends a context when its query is
// about to be sent: the context ends after the connection was acquired
// and before the transaction began.
type endsContext func()

func (f endsContext) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, args []any) (string, []any, error) {
	f()
	return sql, args, nil
}

// A transaction whose context ends before it began (its batch never
// sent) leaves its connection idle, with the bound's deadline set on it
// (boundStatements): the connection is closed, not given back to the
// pool for the next statement to fail on its past deadline.
func TestBoundLeavesNoDeadlineOnAPooledConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testkit.DatabaseURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pool.Ping(ctx))
	tctx, cancel := context.WithCancel(ctx)
	first := &pgx.Batch{}
	first.Queue(`SELECT 1`, endsContext(cancel))
	require.Error(t, pgdb.InTxFrom(tctx, pool, first, func(pgx.Tx) error { return nil }))
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err, "the pool's next statement")
}
