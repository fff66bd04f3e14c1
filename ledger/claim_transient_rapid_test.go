package ledger_test

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// Transient is a write of the claim's holder that fails with a transient
// database error: its statement is canceled (statement_timeout, 57014) or
// its backend terminated (57P01) after the fence. The write rolls back
// (Check counts no probe of it), the error is transient and is not
// ErrFenced, and the execution is not fenced: it holds the claim as
// before, and its next write succeeds (invariant 13: a transient error is
// retried, it stops nothing).
func (m *claimMachine) Transient(t *rapid.T) {
	if len(m.execs) == 0 {
		return // nothing to act on yet
	}
	x := rapid.SampledFrom(m.execs).Draw(t, "execution")
	c, ok, live := m.current(t, x.Claim().SessionID)
	if !ok || !live || c.ExecutionID != x.Claim().ExecutionID || c.Token != x.Claim().Token || x.Fenced() {
		return // not the holder: Write covers fenced writes
	}
	fault := rapid.SampledFrom([]string{
		`SET LOCAL statement_timeout = '1ms'; SELECT pg_sleep(1)`,
		`SELECT pg_terminate_backend(pg_backend_pid())`,
	}).Draw(t, "fault")
	ctx := context.Background()
	err := x.Write(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (topic, key, payload) VALUES ('probe', $1, $2)`,
			x.Claim().SessionID, []byte(x.Claim().ExecutionID)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fault)
		return err
	})
	switch {
	case err == nil:
		t.Fatalf("a write whose statement failed (%s) committed", fault)
	case errors.Is(err, ledger.ErrFenced):
		t.Fatalf("a transient error (%s) fenced the holder: %v", fault, err)
	case !pgdb.Transient(err):
		t.Fatalf("the error of %s is not transient: %v", fault, err)
	case x.Fenced():
		t.Fatalf("a transient error (%s) stopped the holder's execution", fault)
	}
	if err := x.Renew(ctx); err != nil {
		t.Fatalf("the holder's renewal after a transient error: %v", err)
	}
}
