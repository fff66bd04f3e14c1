package pgdb

import (
	"context"
	"errors"
	"fmt"

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
func runTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	returned := false
	defer func() {
		if !returned {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	err := fn(tx)
	returned = true
	if err != nil {
		return errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
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
