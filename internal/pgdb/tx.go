package pgdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// InTx runs fn in a transaction and commits it. The rollback after a failure
// runs on a context that outlives a cancelled ctx, so that a cancelled
// caller never leaves a connection mid-transaction; so does a fn that
// panics or ends its goroutine (runTx).
func InTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	return runTx(ctx, tx, fn)
}

// runTx runs fn in tx and commits, or rolls back when fn fails, panics or
// ends its goroutine (runtime.Goexit): the executor recovers its own
// code's panics and goes on, and a transaction left open would keep its
// connection from the pool for good, and its row locks until the server's
// idle-in-transaction timeout. pgx's BeginFunc rolls back in a defer too;
// it is not used because its rollback takes the caller's context, which a
// cancelled caller has ended.
//
// Every statement fn runs is bounded by ctx, whatever context fn gives it
// (boundStatements).
func runTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	stop := boundStatements(ctx, tx)
	returned := false
	defer func() {
		if !returned {
			stop()
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	err := fn(tx)
	returned = true
	stop()
	if err != nil {
		return errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

// boundStatements gives tx's connection up when ctx ends while fn runs:
// it sets its socket's deadline in the past, as pgx does when a
// statement's own context ends, so that a statement waiting on it fails
// and pgx closes the connection (the server then rolls the transaction
// back). A transaction's statements run on the contexts its fn passes
// them, and a fn's closure may hold a context without the deadline the
// transaction was given (the executor's, say): on a connection gone
// silent (a middlebox that still acknowledges, a failover without a
// reset) its statement waited for good, holding the claim's row and the
// execution's write lock while the claim's keep-alive, on other
// connections, kept recovery from ever taking it over (docs/design.md,
// invariant 13 and "silent connection"). Nothing is lost: a transaction
// whose context has ended cannot commit.
//
// The returned stop disarms it, or waits for it when it has begun and
// closes the connection; it is called before the commit or the rollback
// hands the connection back to the pool, so that no connection in the
// pool is ever touched, nor one with a deadline past given back.
//
// A transaction that never began has no connection to bound (InTxFrom's
// batch when no connection could be acquired: a transaction already
// closed, whose Conn is nil).
func boundStatements(ctx context.Context, tx pgx.Tx) (stop func()) {
	c := tx.Conn()
	if ctx.Done() == nil || c == nil {
		return func() {}
	}
	conn := c.PgConn().Conn()
	fired := make(chan struct{})
	disarm := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = conn.SetDeadline(time.Now())
	})
	return func() {
		if !disarm() {
			<-fired
			// The socket's deadline is past, whatever fn ran: the
			// connection is given up for good. A transaction that never
			// began (the context ended before its batch was sent) leaves
			// it idle, and the pool would take it back with the deadline
			// for its next user's statement to fail on.
			_ = c.PgConn().Close(context.Background())
		}
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// InTxFrom is InTx whose transaction begins with the statements queued in
// first, sent together with BEGIN in one round trip; their result
// callbacks have run when fn is called.
func InTxFrom(ctx context.Context, pool *pgxpool.Pool, first *pgx.Batch, fn func(pgx.Tx) error) error {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.QueuedQueries = append(b.QueuedQueries, first.QueuedQueries...)
	br := pool.SendBatch(ctx, b)
	// first's callbacks run in Close: guarded as fn is.
	return runTx(ctx, br.Tx(), func(tx pgx.Tx) error {
		if err := br.Close(); err != nil {
			return err
		}
		return fn(tx)
	})
}
