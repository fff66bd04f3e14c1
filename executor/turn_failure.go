package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/transcript"
)

// failOpts is what a failing turn records of its provider attempt: the
// zero value records none (the turn failed before or between attempts).
type failOpts struct {
	AttemptID    string              // the attempt whose outcome is recorded
	AttemptState ledger.AttemptState // its outcome; "" records nothing
}

// failTurn settles a turn that ends without an answer: the attempt's
// outcome (unless empty), the assistant message errored (created if the
// step never began), phase safe, and turn.failed, in one transaction. After a cancellation it writes once on a
// context that outlives it (afterCancel); the fence still applies.
func (ex *execution) failTurn(ctx context.Context, t *turn, reason string, cause error, o failOpts) (released bool, err error) {
	wctx, finish := ctx, ex.finishRetried
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		wctx, cancel = afterCancel(ctx)
		defer cancel()
		finish = ex.finishOnce
	}
	failed := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		status, found, err := transcript.MessageStatus(ctx, tx, &transcript.MessageStatusParams{MessageID: t.assistantID})
		if err != nil {
			return false, err
		}
		return found && status == "errored", nil
	}
	causeText := storable(cause.Error()) // a provider's or tool's words (storable.go)
	released, err = finish(wctx, failed, func(tx pgx.Tx) error {
		// The calls not run end interrupted, each announced (tool.completed)
		// before the turn's end, in the order they were requested.
		calls, err := ledger.InterruptCalls(wctx, tx, &ledger.InterruptCallsParams{SessionID: ex.sessionID, Output: "interrupted: " + reason})
		if err != nil {
			return err
		}
		interrupted := make([]outbox.Row, 0, len(calls))
		for _, c := range calls {
			p := ledger.CallParams{ID: c.ID, ModelCallID: c.ModelCallID, Tool: c.Tool, Class: c.Class}
			interrupted = append(interrupted, ex.toolEvent(envelope.EventToolCompleted, t.id, p, string(c.State)))
		}
		if err := outbox.Insert(wctx, tx, interrupted...); err != nil {
			return err
		}
		if o.AttemptState != "" {
			if err := ledger.FinishAttemptWith(wctx, tx, o.AttemptID, o.AttemptState, causeText, 0, 0, ex.responseIDs[o.AttemptID]); err != nil {
				return err
			}
		}
		// The step's assistant message exists once its provider attempt
		// began; a turn that fails before that (a permission declined when
		// resumed or continued, the step limit after a tool step) creates
		// it here, so that the claim and turn.failed name a message the
		// transcript holds (invariant 12).
		if err := transcript.InsertAssistantIfAbsent(wctx, tx, ex.assistantParams(t)); err != nil {
			return fmt.Errorf("creating failed turn's assistant message: %w", err)
		}
		if err := transcript.FailAssistant(wctx, tx, &transcript.FailAssistantParams{MessageID: t.assistantID, Error: causeText}); err != nil {
			return fmt.Errorf("storing failed turn: %w", err)
		}
		if err := ex.x.SetPhase(wctx, tx, ledger.PhaseSafe, t.assistantID); err != nil {
			return err
		}
		return outbox.Insert(wctx, tx, ex.e.eventRow(envelope.Event{
			ID: "turn.failed:" + t.assistantID, Type: envelope.EventTurnFailed, SessionID: ex.sessionID,
			At: time.Now().UTC(), MessageIDs: ids(t.inputs), AssistantMessageID: t.assistantID,
			Reason: reason, Error: causeText,
		}))
	})
	if err != nil {
		return false, fmt.Errorf("settling failed turn %s: %w", t.id, err)
	}
	if !released {
		faults.Hit(faults.TurnAfterFail)
	}
	ex.logTurnFailed(ctx, t, reason, cause)
	ex.turnMetric("failed", t)
	return released, nil
}
