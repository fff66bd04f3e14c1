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
// caller never leaves a connection mid-transaction.
func InTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	if err := fn(tx); err != nil {
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
	tx := br.Tx()
	err := br.Close()
	if err == nil {
		err = fn(tx)
	}
	if err != nil {
		return errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}
