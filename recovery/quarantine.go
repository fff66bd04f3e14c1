package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
)

// Kinds of quarantined rows (the kind label of promptline_quarantined_rows).
const (
	KindClaim  = "claim"
	KindInput  = "input"
	KindOutbox = "outbox"
)

// QuarantinedRow is one quarantined row.
type QuarantinedRow struct {
	Kind          string    `json:"kind"`
	ID            string    `json:"id"` // the session ID (claim), the message ID (input) or the row ID (outbox)
	SessionID     string    `json:"session_id"`
	Reason        string    `json:"reason"`
	QuarantinedAt time.Time `json:"quarantined_at"`
}

// ErrNotQuarantined says that no quarantined row has that kind and ID.
var ErrNotQuarantined = errors.New("no such quarantined row")

// QuarantinedCounts counts quarantined rows by kind, from the database (so
// the gauge is right after a restart).
func QuarantinedCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	var claims, inputs, rows int
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM claims WHERE quarantine_reason IS NOT NULL),
		(SELECT count(*) FROM inputs WHERE quarantine_reason IS NOT NULL),
		(SELECT count(*) FROM outbox WHERE quarantine_reason IS NOT NULL)`).Scan(&claims, &inputs, &rows)
	if err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	counts := map[string]int{KindClaim: claims, KindInput: inputs, KindOutbox: rows}
	return counts, nil
}

// ListQuarantined lists quarantined rows, oldest first.
func ListQuarantined(ctx context.Context, pool *pgxpool.Pool) ([]QuarantinedRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT 'claim', session_id, session_id, quarantine_reason, quarantined_at FROM claims WHERE quarantine_reason IS NOT NULL
		UNION ALL
		SELECT 'input', message_id, session_id, quarantine_reason, quarantined_at FROM inputs WHERE quarantine_reason IS NOT NULL
		UNION ALL
		SELECT 'outbox', id::text, key, quarantine_reason, quarantined_at FROM outbox WHERE quarantine_reason IS NOT NULL
		ORDER BY 5, 2`)
	if err != nil {
		return nil, fmt.Errorf("listing quarantined rows: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[QuarantinedRow])
}

// Release lifts the quarantine of one row after an operator repaired it,
// and audits the release. A released claim is scanned again by the next
// recovery pass; a released input waits again.
func Release(ctx context.Context, pool *pgxpool.Pool, kind, id, operator, note string) error {
	var table, key string
	switch kind {
	case KindClaim:
		table, key = "claims", "session_id"
	case KindInput:
		table, key = "inputs", "message_id"
	case KindOutbox:
		// A released outbox row is published by the next relay pass (repair
		// its payload first, or it is quarantined again).
		table, key = "outbox", "id::text"
	default:
		return fmt.Errorf("unknown kind %q: want %s, %s or %s", kind, KindClaim, KindInput, KindOutbox)
	}
	return pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		var reason string
		// table and key come from the switch above, never from input.
		err := tx.QueryRow(ctx, `SELECT quarantine_reason FROM `+table+`
			WHERE `+key+` = $1 AND quarantine_reason IS NOT NULL FOR UPDATE`, id).Scan(&reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%s %s: %w", kind, id, ErrNotQuarantined)
		}
		if err != nil {
			return fmt.Errorf("releasing %s %s: %w", kind, id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+table+` SET quarantine_reason = NULL, quarantined_at = NULL WHERE `+key+` = $1`, id); err != nil {
			return fmt.Errorf("releasing %s %s: %w", kind, id, err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO quarantine_releases (kind, ref, reason, released_by, note) VALUES ($1, $2, $3, $4, nullif($5, ''))`,
			kind, id, reason, operator, note)
		return err
	})
}
