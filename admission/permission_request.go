package admission

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The executor's writes to permission_requests, made in its fenced
// transactions: it asks (park) and marks the ask resumed when it promotes
// the reply's input (resume). The reply itself is recorded by AdmitReply.
// Each runs one statement in the caller's transaction; the policy (when
// to ask, what to announce) stays with the executor. So do its reads: the
// reply to an ask and the session's standing grants, before a call runs,
// and the turn an ask parked, when the reply resumes it.

// InsertPermissionRequestParams names a permission request: the tool
// call it asks about (whose ID is the request's), its session and tool,
// and the metadata shown to whoever replies. The tool is also the
// pattern an "always" grant remembers.
type InsertPermissionRequestParams struct {
	RequestID string
	SessionID string
	CallID    string
	Tool      string
	Metadata  []byte // JSON
}

// InsertPermissionRequest records a pending permission request once, and
// reports whether this call inserted it: a request recorded before (a
// retry after a commit whose answer was lost) is left as it is, replied
// or not. The error is the driver's, for the caller to say what it was
// doing.
func InsertPermissionRequest(ctx context.Context, tx pgx.Tx, p *InsertPermissionRequestParams) (inserted bool, err error) {
	tag, err := tx.Exec(ctx, insertPermissionRequestSQL, p.RequestID, p.SessionID, p.CallID, p.Tool, p.Metadata)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// MarkPermissionResumedParams names the request whose turn resumes.
type MarkPermissionResumedParams struct {
	RequestID string
}

// MarkPermissionResumed sets the request's resumed_at, once: a request
// resumed before keeps its time. The error is the driver's, for the
// caller to say what it was doing.
func MarkPermissionResumed(ctx context.Context, tx pgx.Tx, p *MarkPermissionResumedParams) error {
	_, err := tx.Exec(ctx, markPermissionResumedSQL, p.RequestID)
	return err
}

// RowQuerier runs a query of one row: a pool, a connection or a
// transaction.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PermissionReplyParams names a permission request.
type PermissionReplyParams struct {
	RequestID string
}

// PermissionReply is a permission request as its reply left it.
type PermissionReply struct {
	Status  string // pending, approved or rejected
	Message string // the rejection's message for the model; "" for none
}

// ReadPermissionReply reads the reply to a permission request; found is
// false when there is no such request (the call was never asked about).
// The error is the driver's, for the caller to say what it was doing.
func ReadPermissionReply(ctx context.Context, q RowQuerier, p *PermissionReplyParams) (r PermissionReply, found bool, err error) {
	err = q.QueryRow(ctx, permissionReplySQL, p.RequestID).Scan(&r.Status, &r.Message)
	if errors.Is(interpretError(err), errNotFound) {
		return PermissionReply{}, false, nil
	}
	if err != nil {
		return PermissionReply{}, false, err
	}
	return r, true, nil
}

// PermissionGrantedParams names a session and the pattern of a standing
// grant: the tool's name, which an "always" reply remembers.
type PermissionGrantedParams struct {
	SessionID string
	Pattern   string
}

// PermissionGranted reports whether the session holds a standing
// ("always") grant for the pattern. The error is the driver's, for the
// caller to say what it was doing.
func PermissionGranted(ctx context.Context, q RowQuerier, p *PermissionGrantedParams) (bool, error) {
	var granted bool
	if err := q.QueryRow(ctx, permissionGrantedSQL, p.SessionID, p.Pattern).Scan(&granted); err != nil {
		return false, err
	}
	return granted, nil
}

// ParkedTurnParams names the request a reply answers, and the session
// the reply's input belongs to.
type ParkedTurnParams struct {
	RequestID string
	SessionID string
}

// ParkedTurn returns the assistant message of the turn that the request
// parked: the one of the provider attempt that requested the call asked
// about. found is false when the session has no such request (a reply
// that resumes nothing of this session). The error is the driver's, for
// the caller to say what it was doing.
func ParkedTurn(ctx context.Context, tx pgx.Tx, p *ParkedTurnParams) (assistantMessageID string, found bool, err error) {
	err = tx.QueryRow(ctx, parkedTurnSQL, p.RequestID, p.SessionID).Scan(&assistantMessageID)
	if errors.Is(interpretError(err), errNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return assistantMessageID, true, nil
}

const permissionReplySQL = `SELECT status, coalesce(message, '') FROM permission_requests WHERE request_id = $1`

const permissionGrantedSQL = `SELECT EXISTS (SELECT 1 FROM permission_grants WHERE session_id = $1 AND pattern = $2)`

// PendingPermissionRequestParams names the session.
type PendingPermissionRequestParams struct {
	SessionID string
}

// PendingPermissionRequest returns the least ID of the session's pending
// permission requests, "" when none is: a session parked on an ask,
// whose reply continues its turn. The error is the driver's.
func PendingPermissionRequest(ctx context.Context, q RowQuerier, p *PendingPermissionRequestParams) (string, error) {
	var id string
	if err := q.QueryRow(ctx, pendingPermissionRequestSQL, p.SessionID).Scan(&id); err != nil {
		return "", err
	}
	return id, nil
}

const pendingPermissionRequestSQL = `SELECT coalesce(min(request_id), '') FROM permission_requests
		WHERE session_id = $1 AND status = 'pending'`

// parkedTurnSQL reads across owners (tool_calls and attempts are the
// ledger's): the request names its call, the call its attempt, and only
// the attempt names the turn's assistant message. One statement reads the
// three in one snapshot, in the transaction that promotes the reply. It
// lives with the request it is keyed by, whose absence is what the caller
// acts on.
const parkedTurnSQL = `SELECT a.assistant_message_id FROM permission_requests r
		JOIN tool_calls c ON c.call_id = r.call_id JOIN attempts a ON a.attempt_id = c.attempt_id
		WHERE r.request_id = $1 AND r.session_id = $2`

const insertPermissionRequestSQL = `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, metadata, status)
			VALUES ($1, $2, $3, $4, $4, $5, 'pending') ON CONFLICT (request_id) DO NOTHING`

const markPermissionResumedSQL = `UPDATE permission_requests SET resumed_at = now() WHERE request_id = $1 AND resumed_at IS NULL`
