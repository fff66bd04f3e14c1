package executor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/transcript"
)

// continuation promotes a continuation input that recovery admitted: it
// continues the recovered turn (same turn, same answered inputs) in a new
// assistant message, settles the exact recovery row (matched by session
// and continuation ID: replaying the same events settles nothing twice),
// and picks up the tool calls left requested. A continuation that no
// recovery row (or operator's resolution) of this session vouches for is
// quarantined, not run.
func (ex *execution) continuation(ctx context.Context, tx pgx.Tx, inputID string) (*turn, error) {
	v, found, err := recovery.FindVoucher(ctx, tx, &recovery.FindVoucherParams{ContinuationID: inputID})
	reason := ""
	switch {
	case err != nil:
		return nil, err
	case !found:
		reason = "continuation input without a recovery decision"
	case v.SessionID != ex.sessionID:
		reason = fmt.Sprintf("continuation input belongs to session %s's recovery, not %s", v.SessionID, ex.sessionID)
	}
	if reason != "" {
		if err := admission.QuarantineInput(ctx, tx, &admission.QuarantineInputParams{MessageID: inputID, Reason: reason}); err != nil {
			return nil, fmt.Errorf("quarantining %s: %w", inputID, err)
		}
		ex.e.log.WarnContext(ctx, "continuation input quarantined", slog.String("session_id", ex.sessionID),
			slog.String("message_id", inputID), slog.String("reason", reason))
		return ex.selectTurn(ctx, tx)
	}
	if err := recovery.SettleContinuation(ctx, tx, &recovery.SettleContinuationParams{SessionID: ex.sessionID, ContinuationID: inputID}); err != nil {
		return nil, err
	}
	if err := admission.PromoteInput(ctx, tx, &admission.PromoteInputParams{MessageID: inputID}); err != nil {
		return nil, err
	}

	return ex.continueTurn(ctx, tx, v.AssistantMessageID, v.RetryAttemptID)
}

// continueTurn builds the turn that continues oldAssistant's turn (same
// turn, same answered inputs) in a new assistant message, with the tool
// calls the session left requested, and optionally the idempotency key of
// an attempt to send again.
func (ex *execution) continueTurn(ctx context.Context, tx pgx.Tx, oldAssistant, retryAttempt string) (*turn, error) {
	t := &turn{id: oldAssistant, assistantID: newID(), promotedAt: time.Now()}
	a, err := transcript.ReadAssistantTurn(ctx, tx, &transcript.AssistantTurnParams{MessageID: oldAssistant})
	if err != nil {
		return nil, fmt.Errorf("reading the recovered turn: %w", err)
	}
	if a.Status == "pending" {
		// The step never got an answer (its attempt was deferred, not
		// sent): this step answers in that same message.
		t.assistantID = oldAssistant
	}
	if a.TurnID != "" {
		t.id = a.TurnID
	}
	if t.inputs, err = transcript.TurnInputs(ctx, tx, &transcript.TurnInputsParams{MessageIDs: a.Answers}); err != nil {
		return nil, fmt.Errorf("reading the recovered turn's inputs: %w", err)
	}
	// Steps the turn completed before, each announced by its
	// step.completed: the continuation's steps go on counting from there. A
	// step that never completed (errored: its turn failed first) had none,
	// and the step sent again after it takes its number, as a re-send in
	// the same (pending) message does.
	if t.stepBase, err = transcript.CompletedSteps(ctx, tx, &transcript.CompletedStepsParams{
		SessionID: ex.sessionID, TurnID: t.id, ExceptMessageID: t.assistantID}); err != nil {
		return nil, fmt.Errorf("counting the recovered turn's steps: %w", err)
	}
	// The new step's assistant message is created when its provider step
	// begins, not here: a continuation that dies while running the calls
	// left over must not leave a message that nothing will settle.
	if retryAttempt != "" {
		if t.retryKey, err = ledger.AttemptKey(ctx, tx, &ledger.AttemptKeyParams{AttemptID: retryAttempt}); err != nil {
			return nil, err
		}
	}
	calls, err := ledger.RequestedCalls(ctx, tx, &ledger.RequestedCallsParams{SessionID: ex.sessionID})
	if err != nil {
		return nil, err
	}
	for _, p := range calls {
		t.pendingCalls = append(t.pendingCalls, pendingCall{params: p, call: provider.ToolCall{ID: p.ModelCallID, Name: p.Tool, Input: p.Input}})
	}
	return t, ex.x.SetPhase(ctx, tx, ledger.PhaseContinue, oldAssistant)
}
