package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
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
	QuarantinedAt pgdb.Time `json:"quarantined_at"`
	// QuarantinedAtNotFinite is quarantined_at when it is not a time
	// ('-infinity', 'infinity': a hand edit), QuarantinedAt then zero, as
	// Evidence.ExpiredAtNotFinite is a claim's expires_at.
	QuarantinedAtNotFinite string `json:"quarantined_at_not_finite,omitempty"`
}

// ErrNotQuarantined says that no quarantined row has that kind and ID.
var ErrNotQuarantined = errors.New("no such quarantined row")

// QuarantinedCounts counts quarantined rows by kind, from the database (so
// the gauge is right after a restart). Each kind's owner counts its rows,
// one after the other in one read-only transaction: a gauge, not a
// snapshot.
//
// Sequential scans are off for the transaction: the counts run on every
// pass of every process, and inputs and the outbox hold every row of their
// retention, so each must read its table's index of quarantined rows
// (migration 00019) whatever the planner knows. Before a table's first
// analyze (a fresh or restored database, a deployment's first minute) the
// planner takes IS NOT NULL to hold for nearly every row and chose a scan
// of the whole table, which the connection then kept for the statement
// until an analyze (TestQuarantinedCountsReadNoTable).
func QuarantinedCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]int, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('enable_seqscan', 'off', true)`); err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	claims, err := ledger.CountQuarantinedClaims(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	inputs, err := admission.CountQuarantinedInputs(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	rows, err := outbox.CountQuarantined(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("counting quarantined rows: %w", err)
	}
	counts := map[string]int{KindClaim: claims, KindInput: inputs, KindOutbox: rows}
	return counts, nil
}

// ListQuarantined lists quarantined rows, oldest first. It reads the
// three owners' tables in one statement on purpose (docs/design.md, Reads
// across owners): the kinds are ordered together by the database, in one
// snapshot.
func ListQuarantined(ctx context.Context, pool *pgxpool.Pool) ([]QuarantinedRow, error) {
	rows, err := pool.Query(ctx, quarantinedRowsSQL+`
		ORDER BY 5, 2`)
	if err != nil {
		return nil, fmt.Errorf("listing quarantined rows: %w", err)
	}
	return collectQuarantined(rows, []QuarantinedRow{}) // --json prints [] for none
}

// quarantinedRowsSQL is every quarantined row of the three owners' tables:
// kind, id, session_id, reason, at.
const quarantinedRowsSQL = `
		SELECT 'claim' AS kind, session_id AS id, session_id, quarantine_reason AS reason, quarantined_at AS at FROM claims WHERE quarantine_reason IS NOT NULL
		UNION ALL
		SELECT 'input', message_id, session_id, quarantine_reason, quarantined_at FROM inputs WHERE quarantine_reason IS NOT NULL
		UNION ALL
		SELECT 'outbox', id::text, key, quarantine_reason, quarantined_at FROM outbox WHERE quarantine_reason IS NOT NULL`

// collectQuarantined appends the rows of a quarantinedRowsSQL read to out.
func collectQuarantined(rows pgx.Rows, out []QuarantinedRow) ([]QuarantinedRow, error) {
	var q QuarantinedRow
	_, err := pgx.ForEachRow(rows, []any{&q.Kind, &q.ID, &q.SessionID, &q.Reason, &q.QuarantinedAt}, func() error {
		q.QuarantinedAtNotFinite = q.QuarantinedAt.NotFinite
		out = append(out, q)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing quarantined rows: %w", err)
	}
	return out, nil
}

// ErrStillInvalid says that a quarantined row still fails the validation
// that quarantined it: releasing it would only have it quarantined again.
var ErrStillInvalid = errors.New("still fails validation")

// ReleaseOpts describes one release.
type ReleaseOpts struct {
	// Operator names who releases the row, recorded in the audit.
	Operator string
	// Note says what was repaired, recorded in the audit. Defaults to none.
	Note string
	// Topics names the outbox targets of a released input's wake. Defaults
	// to kafkautil's defaults.
	Topics kafkautil.Topics
	// QuarantinedAt, when not nil, releases the row only if its quarantine
	// began then (QuarantinedRow.QuarantinedAt as listed), else
	// ErrNotQuarantined: a row released and quarantined again since it was
	// listed is left alone. Defaults to the row's quarantine, whenever it
	// began.
	QuarantinedAt *pgdb.Time
}

// Release lifts the quarantine of one row after an operator repaired it,
// and audits the release.
//
// A claim is checked first: one that still fails recovery's validation is
// not released (ErrStillInvalid, naming the reason); a released claim is
// decided by the next recovery pass, which wakes the session as any
// decision does. A released input waits again, and the release wakes its
// session in the same transaction when nothing else will (no claim holds
// the session; a claim's holder, or recovery, sees the input when it
// releases or decides: invariant 7). Claims and inputs are released under
// their session's row lock, taken first, as admission and recovery take it.
func Release(ctx context.Context, pool *pgxpool.Pool, kind, id string, opts *ReleaseOpts) error {
	switch kind {
	case KindClaim, KindInput, KindOutbox:
	default:
		return fmt.Errorf("unknown kind %q: want %s, %s or %s", kind, KindClaim, KindInput, KindOutbox)
	}
	topics := opts.Topics.WithDefaults()
	return pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		session, err := lockSessionOf(ctx, tx, kind, id)
		if err != nil {
			return fmt.Errorf("releasing %s %s: %w", kind, id, err)
		}
		// Each owner lifts its row's quarantine (docs/design.md, table
		// owners); an error below rolls the lift back.
		var reason string
		var found, wake bool
		switch kind {
		case KindClaim:
			reason, found, err = ledger.ReleaseClaim(ctx, tx, &ledger.ReleaseClaimParams{SessionID: id, QuarantinedAt: opts.QuarantinedAt})
		case KindInput:
			var in admission.ReleasedInput
			in, found, err = admission.ReleaseInput(ctx, tx, &admission.ReleaseInputParams{MessageID: id, QuarantinedAt: opts.QuarantinedAt})
			reason, wake = in.Reason, in.Waiting
			if err == nil && found && in.SessionID != session {
				return fmt.Errorf("releasing %s %s: it moved from session %s to %s meanwhile; try again", kind, id, session, in.SessionID)
			}
		case KindOutbox:
			reason, found, err = outbox.Release(ctx, tx, &outbox.ReleaseParams{ID: id, QuarantinedAt: opts.QuarantinedAt})
		}
		if err != nil {
			return fmt.Errorf("releasing %s %s: %w", kind, id, err)
		}
		if !found {
			return fmt.Errorf("%s %s: %w", kind, id, ErrNotQuarantined)
		}
		if kind == KindClaim {
			if still, err := stillInvalid(ctx, tx, session); err != nil {
				return fmt.Errorf("releasing %s %s: %w", kind, id, err)
			} else if still != "" {
				return fmt.Errorf("%s %s: %w: %s; repair it, then release it", kind, id, ErrStillInvalid, still)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO quarantine_releases (kind, ref, reason, released_by, note) VALUES ($1, $2, $3, $4, nullif($5, ''))`,
			kind, id, reason, opts.Operator, opts.Note); err != nil {
			return fmt.Errorf("auditing the release of %s %s: %w", kind, id, err)
		}
		if !wake {
			return nil
		}
		// The input waits again: its session is woken here unless a claim
		// holds it (the holder, or recovery, sees the input when it
		// releases or decides).
		if _, held, err := ledger.Get(ctx, tx, session); err != nil {
			return fmt.Errorf("releasing %s %s: %w", kind, id, err)
		} else if held {
			return nil
		}
		return outbox.Insert(ctx, tx, outbox.WakeRow(topics.Wakes, session, "release", time.Now().UTC()))
	})
}

// lockSessionOf locks the session row of a claim or an input (the first
// lock of every writer of a session, docs/design.md, invariant 7) and returns the
// session; an outbox row locks none ("").
func lockSessionOf(ctx context.Context, tx pgx.Tx, kind, id string) (string, error) {
	session := id
	switch kind {
	case KindOutbox:
		return "", nil
	case KindInput:
		var found bool
		var err error
		session, found, err = admission.InputSession(ctx, tx, id)
		if err != nil {
			return "", err
		}
		if !found {
			return "", fmt.Errorf("%w", ErrNotQuarantined)
		}
	}
	// A missing session locks nothing and is no error here: the row's own
	// release then finds nothing to release.
	if _, _, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: session}); err != nil {
		return "", fmt.Errorf("locking session: %w", err)
	}
	return session, nil
}

// stillInvalid runs recovery's validation over a quarantined claim, on
// the evidence a decision would read, and returns why it still fails, or "".
func stillInvalid(ctx context.Context, tx pgx.Tx, session string) (string, error) {
	c, ok, err := ledger.Get(ctx, tx, session)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("reading the claim of %s: it is gone", session)
	}
	ev, err := gather(ctx, tx, c)
	switch {
	case err == nil:
		return validate(c, ev), nil
	case ctx.Err() != nil || pgdb.Transient(err):
		return "", err
	}
	// Its evidence cannot be read, as when it was quarantined "decision
	// failed": still invalid (the release is refused and rolled back), not
	// an error that would stop a bulk release at this row.
	return "its evidence cannot be read: " + err.Error(), nil
}

// quarantinedPageParams selects a page of one kind's quarantined rows for
// a bulk release.
type quarantinedPageParams struct {
	Kind string
	// ReasonContains keeps the rows whose reason contains it, as written
	// (no pattern, case counts); "" keeps every row.
	ReasonContains string
	// Before keeps the rows quarantined at or before it, and those whose
	// quarantined_at is 'infinity' (a hand edit; listed, not lost): a row
	// quarantined again after the bulk began is not part of it.
	Before time.Time
	// After, when not nil, keeps the rows after (After, AfterID) in the
	// order of quarantine time, then ID.
	After   *pgdb.Time
	AfterID string
	Limit   int
}

// listQuarantinedPage reads one page of quarantined rows in the order of
// ListQuarantined, from the same statement narrowed to one kind.
func listQuarantinedPage(ctx context.Context, pool *pgxpool.Pool, p *quarantinedPageParams) ([]QuarantinedRow, error) {
	var after pgdb.Time
	if p.After != nil {
		after = *p.After
	}
	rows, err := pool.Query(ctx, `
		SELECT kind, id, session_id, reason, at FROM (`+quarantinedRowsSQL+`) q
		WHERE kind = $1 AND strpos(reason, $2) > 0
		  AND (at <= $3 OR at = 'infinity')
		  AND ($4 OR (at, id) > ($5, $6))
		ORDER BY at, id
		LIMIT $7`, p.Kind, p.ReasonContains, p.Before, p.After == nil, after, p.AfterID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("listing quarantined rows: %w", err)
	}
	return collectQuarantined(rows, nil)
}
