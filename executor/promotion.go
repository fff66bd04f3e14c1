package executor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/transcript"
)

// promote takes the next turn's inputs: every waiting steer if any (they
// jump the queue), else the oldest queued input. It creates their user
// messages and the turn's first (pending) assistant message in the same
// transaction.
func (ex *execution) promote(ctx context.Context) (*turn, error) {
	v := ex.view
	ex.view = nil
	if v == nil {
		var err error
		if v, err = ex.readView(ctx); err != nil {
			return nil, err
		}
	}
	if len(v.waiting) == 0 {
		return nil, nil // the caller's release looks again, under the session lock
	}
	if v.unreadable != nil {
		// No turn can be sent on a transcript that cannot be read, and
		// none will be until a person repairs it: the claim is left to
		// expire (execute), and recovery quarantines it with the part
		// named (docs/design.md, P6 and invariant 13). Dropped instead,
		// the session would be read and dropped again at every wake.
		return nil, fmt.Errorf("reading the session's transcript; its claim is left to recovery, which quarantines it: %w", v.unreadable)
	}
	if v.plain() {
		return ex.promoteQueued(ctx, v)
	}
	if ex.e.beforePromote != nil {
		ex.e.beforePromote()
	}
	// Retried like the common turn's promotion (promoteQueued): nothing
	// was dispatched yet, so a transient error is retried while the lease
	// lives, where the turn was left to recovery as outcome unknown. A
	// retry keeps the write's position, so one whose first try committed
	// unheard is refused by the fence as applied, and the turn the last
	// try built is the one that committed (ledger/retry.go: a retry's
	// fence passes only once the try before it has rolled back). Each try
	// reads the session again and builds its turn afresh, numbering its
	// attempt from where the execution stood.
	var t *turn
	steps := ex.steps
	err := ex.writeRetried(ctx, nil, func(tx pgx.Tx) error {
		var err error
		ex.steps = steps
		t, err = ex.promoteTx(ctx, tx)
		return err
	})
	return t, err
}

// promoteTx promotes inside tx and commits the first step's attempt
// intent with it; nil when nothing waits.
func (ex *execution) promoteTx(ctx context.Context, tx pgx.Tx) (*turn, error) {
	t, err := ex.selectTurn(ctx, tx)
	if err != nil || t == nil {
		return nil, err
	}
	if len(t.pendingCalls) > 0 {
		return t, nil // the calls run first; the step's intent follows them
	}
	req, err := ex.beginStep(ctx, tx, t, 1, ex.nextAttemptID())
	if err != nil {
		return nil, err
	}
	t.begun = &req
	return t, nil
}

// selectTurn promotes the next turn's inputs inside tx.
func (ex *execution) selectTurn(ctx context.Context, tx pgx.Tx) (*turn, error) {
	cl := ex.x.Claim()
	rows, err := tx.Query(ctx, waitingSQL, ex.sessionID, maxSteersPerTurn, maxSteerBytesPerTurn)
	if err != nil {
		return nil, fmt.Errorf("reading waiting inputs: %w", err)
	}
	all, err := scanWaiting(rows)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, nil
	}
	for _, w := range all {
		switch {
		case w.kind == admission.KindContinuation:
			return ex.continuation(ctx, tx, w.id)
		case w.kind == admission.KindPermissionReply:
			return ex.resume(ctx, tx, w.id)
		}
	}
	pick := pickTurn(all)
	t := newTurn(pick)
	for _, w := range pick {
		if _, err := tx.Exec(ctx, promoteSQL, w.id, cl.ExecutionID, cl.Token); err != nil {
			return nil, fmt.Errorf("promoting %s: %w", w.id, err)
		}
	}
	if err := transcript.InsertAssistant(ctx, tx, ex.assistantParams(t)); err != nil {
		return nil, fmt.Errorf("creating assistant message: %w", err)
	}
	if err := outbox.Insert(ctx, tx, ex.turnStarted(t)); err != nil {
		return nil, err
	}
	return t, ex.x.SetPhase(ctx, tx, ledger.PhaseReady, t.assistantID)
}
