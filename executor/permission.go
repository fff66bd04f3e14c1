package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// replyRequestID is the request a reply's input resumes.
func replyRequestID(inputID string) string {
	if id, ok := strings.CutPrefix(inputID, admission.ReplyPrefix); ok {
		return id
	}
	return strings.TrimPrefix(inputID, admission.ReplyTakenPrefix)
}

var (
	// errParked: a tool call waits for permission; the session is parked
	// and the claim released.
	errParked = errors.New("waiting for permission")
	// errDeclined: a permission was declined without feedback; the turn
	// stops.
	errDeclined = errors.New("permission declined")
)

// permission returns the policy for a tool: allow unless configured.
func (ex *execution) permission(tool string) tools.Permission {
	if f := ex.e.cfg.PermissionFunc; f != nil {
		return f(tool)
	}
	return tools.Allow
}

// checkPermission decides whether call p may run now. For an ask it reads
// the durable request (and the session's "always" grants): granted runs,
// rejected with a message returns the message as feedback for the model,
// rejected without one declines the turn, anything else parks the session.
func (ex *execution) checkPermission(ctx context.Context, p ledger.CallParams, c provider.ToolCall) (feedback string, err error) {
	switch ex.permission(c.Name) {
	case tools.Allow:
		return "", nil
	case tools.Deny:
		return fmt.Sprintf("denied: tool %q is not permitted here", c.Name), nil
	}
	rctx, cancel := ex.readCtx(ctx)
	defer cancel()
	r, found, err := admission.ReadPermissionReply(rctx, ex.e.pool, &admission.PermissionReplyParams{RequestID: p.ID})
	switch {
	case err != nil:
		return "", fmt.Errorf("reading permission request %s: %w", p.ID, err)
	case !found:
		granted, err := admission.PermissionGranted(rctx, ex.e.pool, &admission.PermissionGrantedParams{SessionID: ex.sessionID, Pattern: c.Name})
		if err != nil {
			return "", fmt.Errorf("reading permission grants: %w", err)
		}
		if granted {
			return "", nil
		}
		return "", ex.park(ctx, p, c)
	case r.Status == "approved":
		return "", nil
	case r.Status == "rejected" && r.Message != "":
		return "declined: " + r.Message, nil
	case r.Status == "rejected":
		return "", errDeclined
	}
	return "", ex.park(ctx, p, c) // still pending: parked again
}

// park persists the permission request and announces it, in one fenced
// transaction, and returns errParked: the executor then releases the claim.
//
// The same transaction sets the claim's phase to safe: from here on the
// turn is continued by the reply's input, never by recovery. Left at
// continue, a claim whose release is lost (a crash or a cut connection
// right after the ask) is continued by recovery as well as by the reply
// when the reply arrives first: the turn is continued twice, answered
// twice, and the tool asked for again. Safe makes recovery clear the claim
// and wake the session when the reply waits (invariant 7).
func (ex *execution) park(ctx context.Context, p ledger.CallParams, c provider.ToolCall) error {
	meta, _ := json.Marshal(map[string]any{"input": jsonOrString(c.Input), "model_call_id": c.ID})
	// Idempotent (the request is inserted once, and announced only then):
	// a retry after a commit whose answer was lost changes nothing more.
	err := ex.writeRetried(ctx, nil, func(tx pgx.Tx) error {
		if err := ex.x.SetPhase(ctx, tx, ledger.PhaseSafe, ""); err != nil {
			return err
		}
		inserted, err := admission.InsertPermissionRequest(ctx, tx, &admission.InsertPermissionRequestParams{
			RequestID: p.ID, SessionID: ex.sessionID, CallID: p.ID, Tool: c.Name, Metadata: meta})
		if err != nil {
			return fmt.Errorf("recording permission request: %w", err)
		}
		if !inserted {
			return nil
		}
		return outbox.Insert(ctx, tx, ex.e.eventRow(envelope.Event{
			ID: "permission.asked:" + p.ID, Type: envelope.EventPermissionAsked, SessionID: ex.sessionID,
			At: time.Now().UTC(), RequestID: p.ID, Tool: c.Name, Input: jsonOrString(c.Input),
		}))
	})
	if err != nil {
		return err
	}
	ex.e.log.InfoContext(ctx, "permission asked; session parked", slog.String("session_id", ex.sessionID),
		slog.String("request_id", p.ID), slog.String("tool", c.Name))
	return errParked
}

// resume promotes a permission reply's input: it continues the parked turn,
// whose call (still requested) is then checked again against the reply.
func (ex *execution) resume(ctx context.Context, tx pgx.Tx, inputID string) (*turn, error) {
	requestID := replyRequestID(inputID)
	// Lock order: the session row first, as everywhere. A reply's
	// admission delivered again locks the session, then the request; this
	// transaction marks the request and later writes rows whose foreign
	// keys take the session row's key-share lock: locking the session
	// first keeps the two from deadlocking (a deadlock costs the resume
	// deadlock_timeout, past a short lease).
	if _, _, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: ex.sessionID}); err != nil {
		return nil, fmt.Errorf("locking session %s: %w", ex.sessionID, err)
	}
	assistant, found, err := admission.ParkedTurn(ctx, tx, &admission.ParkedTurnParams{RequestID: requestID, SessionID: ex.sessionID})
	if err != nil {
		return nil, fmt.Errorf("reading permission request %s: %w", requestID, err)
	}
	if !found {
		if err := admission.QuarantineInput(ctx, tx, &admission.QuarantineInputParams{MessageID: inputID, Reason: "permission reply without a request of this session"}); err != nil {
			return nil, err
		}
		return ex.selectTurn(ctx, tx)
	}
	if err := admission.MarkPermissionResumed(ctx, tx, &admission.MarkPermissionResumedParams{RequestID: requestID}); err != nil {
		return nil, err
	}
	if err := admission.PromoteInput(ctx, tx, &admission.PromoteInputParams{MessageID: inputID}); err != nil {
		return nil, err
	}
	// The call asked about (the request's ID is its call's) is still
	// requested while its turn is parked. Otherwise the turn went on
	// without this reply (another continuation of it ran the call), and
	// continuing it again would send a step and act a second time
	// (invariant 12): the reply is consumed, and nothing continues.
	state, err := ledger.ReadCallState(ctx, tx, requestID)
	if err != nil {
		return nil, err
	}
	if state != ledger.CallRequested {
		ex.e.log.WarnContext(ctx, "permission reply to a call no longer requested; its turn went on without it",
			slog.String("session_id", ex.sessionID), slog.String("request_id", requestID), slog.String("call_state", string(state)))
		return ex.selectTurn(ctx, tx)
	}
	return ex.continueTurn(ctx, tx, assistant, "")
}
