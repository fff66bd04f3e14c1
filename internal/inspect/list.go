package inspect

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
)

// States lists the session states a list can be filtered by, in the order
// of their precedence (a session in several is in the first).
var States = []string{StateQuarantined, StateClaimExpired, StateRunning, StateParked, StateWaiting, StateIdle}

// SessionRow is one session of a list: what a line of the console's
// sessions page shows.
type SessionRow struct {
	SessionID      string    `json:"session_id"`
	State          string    `json:"state"`
	FencingToken   int64     `json:"fencing_token"`
	CreatedAt      pgdb.Time `json:"created_at"`
	LastAdmittedAt pgdb.Time `json:"last_admitted_at"`
}

// Cursor is a keyset position in the sessions list (newest first): the
// page after it starts with the next older session. The zero Cursor is
// the start. Its time may be one that is not a time: the list pages on
// past a session created at '-infinity' or 'infinity' (a hand edit) as
// past any other.
type Cursor struct {
	CreatedAt pgdb.Time
	SessionID string
}

// IsZero says whether c is the start of the list.
func (c Cursor) IsZero() bool { return c.SessionID == "" }

// ListParams selects a page of sessions.
type ListParams struct {
	// State keeps only sessions in that state (one of States). Defaults to
	// every state.
	State string
	// Search keeps only the session with that ID, or the session of the
	// input with that message ID. Defaults to no search.
	Search string
	// After is where the page starts. Defaults to the newest session.
	After Cursor
	// Limit is the page's length. Defaults to 50.
	Limit int
}

// ErrUnknownState says that a list was asked for a state that is not one
// of States.
var ErrUnknownState = fmt.Errorf("unknown state: want one of %v", States)

// ListSessions reads one page of sessions, newest first (by creation),
// with each session's state as Session derives it. next is the cursor of
// the following page, zero when this page is the last.
//
// Every page is read by index (sessions_newest), whatever the table's
// size: a state filter is a condition checked per row on the index scan,
// and for the states that only a few sessions are in (those with a claim,
// parked ones) the scan starts from those few rows instead.
func ListSessions(ctx context.Context, pool *pgxpool.Pool, p ListParams) (rows []SessionRow, next Cursor, err error) {
	if p.State != "" && !known(p.State) {
		return nil, Cursor{}, fmt.Errorf("%q: %w", p.State, ErrUnknownState)
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 50
	}
	query := listSQL
	switch p.State {
	case StateQuarantined, StateClaimExpired, StateRunning:
		query = listWithClaimSQL
	case StateParked:
		query = listParkedSQL
	}
	var afterAt *pgdb.Time
	if !p.After.IsZero() {
		at := p.After.CreatedAt
		afterAt = &at
	}
	res, err := pool.Query(ctx, query, p.State, p.Search, afterAt, p.After.SessionID, limit+1)
	if err != nil {
		return nil, Cursor{}, fmt.Errorf("listing sessions: %w", err)
	}
	rows, err = pgx.CollectRows(res, pgx.RowToStructByPos[SessionRow])
	if err != nil {
		return nil, Cursor{}, fmt.Errorf("listing sessions: %w", err)
	}
	for i := range rows {
		rows[i].CreatedAt = rows[i].CreatedAt.UTC()
		rows[i].LastAdmittedAt = rows[i].LastAdmittedAt.UTC()
	}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		next = Cursor{CreatedAt: last.CreatedAt, SessionID: last.SessionID}
	}
	return rows, next, nil
}

func known(state string) bool {
	for _, s := range States {
		if s == state {
			return true
		}
	}
	return false
}

// stateSQL derives a session's state in SQL exactly as state() does in Go
// (the same precedence). The waiting test repeats the view's predicate so
// that the planner sees it matches inputs_waiting_session and probes that
// index per session. No column counts a session's inputs: inputs has no
// index on session_id alone, and a count per row scanned the table (470 ms
// a page at 100,000 sessions, measured).
const stateSQL = `
CASE
  WHEN c.quarantine_reason IS NOT NULL THEN 'quarantined'
  WHEN c.expires_at <= now() THEN 'claim_expired'
  WHEN c.session_id IS NOT NULL THEN 'running'
  WHEN EXISTS (SELECT 1 FROM permission_requests p WHERE p.session_id = s.session_id AND p.status = 'pending') THEN 'parked'
  WHEN EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.session_id = s.session_id
               AND w.promotion_seq IS NULL AND w.wake_pending AND w.quarantine_reason IS NULL) THEN 'waiting'
  ELSE 'idle'
END`

// The list queries: $1 state (” for any), $2 search (” for none), $3 and
// $4 the cursor (created_at, session_id; NULL for the start), $5 the limit.
// The row-value comparison (s.created_at, s.session_id) < ($3, $4) is what
// lets the scan of sessions_newest start at the cursor.
const listTail = `
  AND ($2 = '' OR s.session_id = $2 OR s.session_id = (SELECT i.session_id FROM inputs i WHERE i.message_id = $2))
  AND ($3::timestamptz IS NULL OR (s.created_at, s.session_id) < ($3::timestamptz, $4::text))
) l
WHERE $1 = '' OR l.state = $1
ORDER BY l.created_at DESC, l.session_id DESC
LIMIT $5`

const listColumns = `
SELECT l.session_id, l.state, l.fencing_token, l.created_at, l.last_admitted_at
FROM (SELECT s.session_id, s.fencing_token, s.created_at, s.last_admitted_at,` + stateSQL + ` AS state`

const listSQL = listColumns + `
  FROM sessions s LEFT JOIN claims c ON c.session_id = s.session_id
  WHERE true` + listTail

const listWithClaimSQL = listColumns + `
  FROM claims c JOIN sessions s ON s.session_id = c.session_id
  WHERE true` + listTail

const listParkedSQL = listColumns + `
  FROM sessions s LEFT JOIN claims c ON c.session_id = s.session_id
  WHERE s.session_id IN (SELECT p.session_id FROM permission_requests p WHERE p.status = 'pending')` + listTail

// RecoveryRow is one recovery decision of the recent list.
type RecoveryRow struct {
	ExecutionID      string    `json:"execution_id"`
	SessionID        string    `json:"session_id"`
	PhaseFound       string    `json:"phase_found"`
	Decision         string    `json:"decision"`
	TokenBefore      int64     `json:"token_before"`
	TokenAfter       int64     `json:"token_after"`
	RecoveredBy      string    `json:"recovered_by"`
	DecidedAt        pgdb.Time `json:"decided_at"`
	QuarantineReason *string   `json:"quarantine_reason"`
}

// RecoveryCursor is a keyset position in the recent decisions (newest
// first). The zero RecoveryCursor is the start.
type RecoveryCursor struct {
	DecidedAt   pgdb.Time
	ExecutionID string
}

// IsZero says whether c is the start of the list.
func (c RecoveryCursor) IsZero() bool { return c.ExecutionID == "" }

// RecentRecoveries reads one page of recovery decisions, newest first,
// optionally of one decision kind ("" for all), by index
// (recoveries_recent). next is zero when this page is the last.
func RecentRecoveries(ctx context.Context, pool *pgxpool.Pool, decision string, after RecoveryCursor, limit int) (rows []RecoveryRow, next RecoveryCursor, err error) {
	if limit <= 0 {
		limit = 50
	}
	var afterAt *pgdb.Time
	if !after.IsZero() {
		at := after.DecidedAt
		afterAt = &at
	}
	res, err := pool.Query(ctx, recentRecoveriesSQL, decision, afterAt, after.ExecutionID, limit+1)
	if err != nil {
		return nil, RecoveryCursor{}, fmt.Errorf("listing recoveries: %w", err)
	}
	rows, err = pgx.CollectRows(res, pgx.RowToStructByPos[RecoveryRow])
	if err != nil {
		return nil, RecoveryCursor{}, fmt.Errorf("listing recoveries: %w", err)
	}
	for i := range rows {
		rows[i].DecidedAt = rows[i].DecidedAt.UTC()
	}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		next = RecoveryCursor{DecidedAt: last.DecidedAt, ExecutionID: last.ExecutionID}
	}
	return rows, next, nil
}

const recentRecoveriesSQL = `
SELECT execution_id, session_id, phase_found, decision, token_before, token_after, recovered_by, decided_at, quarantine_reason
FROM recoveries
WHERE ($1 = '' OR decision = $1)
  AND ($2::timestamptz IS NULL OR (decided_at, execution_id) < ($2::timestamptz, $3::text))
ORDER BY decided_at DESC, execution_id DESC
LIMIT $4`

// Release is one audited release of a quarantined row.
type Release struct {
	Kind       string    `json:"kind"`
	Ref        string    `json:"ref"`
	Reason     string    `json:"reason"`
	ReleasedBy string    `json:"released_by"`
	Note       *string   `json:"note"`
	ReleasedAt pgdb.Time `json:"released_at"`
}

// Releases reads the audited releases of a session's claim and inputs,
// oldest first.
func Releases(ctx context.Context, pool *pgxpool.Pool, sessionID string) ([]Release, error) {
	res, err := pool.Query(ctx, releasesSQL, sessionID)
	if err != nil {
		return nil, fmt.Errorf("reading releases of %s: %w", sessionID, err)
	}
	out, err := pgx.CollectRows(res, pgx.RowToStructByPos[Release])
	if err != nil {
		return nil, fmt.Errorf("reading releases of %s: %w", sessionID, err)
	}
	for i := range out {
		out[i].ReleasedAt = out[i].ReleasedAt.UTC()
	}
	return out, nil
}

const releasesSQL = `
SELECT kind, ref, reason, released_by, note, released_at FROM quarantine_releases
WHERE (kind = 'claim' AND ref = $1)
   OR (kind = 'input' AND ref IN (SELECT message_id FROM inputs WHERE session_id = $1))
ORDER BY released_at, id`
