package admission

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// The executor's writes to permission_requests, made in its fenced
// transactions: it asks (park) and marks the ask resumed when it promotes
// the reply's input (resume). The reply itself is recorded by AdmitReply.
// Each runs one statement in the caller's transaction; the policy (when
// to ask, what to announce) stays with the executor.

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

const insertPermissionRequestSQL = `INSERT INTO permission_requests (request_id, session_id, call_id, tool, pattern, metadata, status)
			VALUES ($1, $2, $3, $4, $4, $5, 'pending') ON CONFLICT (request_id) DO NOTHING`

const markPermissionResumedSQL = `UPDATE permission_requests SET resumed_at = now() WHERE request_id = $1 AND resumed_at IS NULL`
