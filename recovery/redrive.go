package recovery

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/outbox"
)

// redrivePaced re-wakes sessions whose waiting inputs have no claim and
// are older than RedriveAfter (their wake was lost), at most once per
// RedriveAfter per session, bounded and in a stable order; with a Rate,
// one token per session, waiting for tokens (holding nothing) until
// deadline. deferred counts the sessions found and left for the next pass
// for want of a token.
func (r *Recoverer) redrivePaced(ctx context.Context, deadline time.Time) (n, deferred int, err error) {
	for n < r.cfg.Batch {
		woken, left, after, err := r.redriveFor(ctx, "", r.cfg.Batch-n, r.cfg.Rate > 0)
		n += woken
		if err != nil || left == 0 {
			return n, 0, err
		}
		if time.Now().Add(after).After(deadline) {
			return n, left, nil
		}
		if err := waitCtx(ctx, after); err != nil {
			return n, 0, err
		}
	}
	return n, 0, nil
}

// redriveSession re-wakes one session if its wake is lost (an apply).
func (r *Recoverer) redriveSession(ctx context.Context, sessionID string) (int, error) {
	n, _, _, err := r.redriveFor(ctx, sessionID, 1, false)
	return n, err
}

// redriveFor re-wakes up to batch sessions whose wake was lost; when
// paced, as many as the bucket gives tokens for: left are the sessions
// found and not woken, after how long until the next token.
func (r *Recoverer) redriveFor(ctx context.Context, sessionID string, batch int, pace bool) (n, left int, after time.Duration, err error) {
	err = pgdb.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, redriveSQL, r.cfg.RedriveAfter.Milliseconds(), batch, sessionID)
		if err != nil {
			return fmt.Errorf("scanning lost wakes: %w", err)
		}
		sessions, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("scanning lost wakes: %w", err)
		}
		if pace && len(sessions) > 0 {
			// The sessions are locked (SKIP LOCKED, as admission locks
			// them); the bucket never makes this wait (takeTokens).
			t, err := r.takeTokens(ctx, tx, len(sessions))
			if err != nil {
				return err
			}
			left, after = len(sessions)-t.got, t.after
			sessions = sessions[:t.got]
		}
		n = len(sessions)
		if n == 0 {
			return nil
		}
		if err := admission.MarkRedriven(ctx, tx, &admission.MarkRedrivenParams{SessionIDs: sessions}); err != nil {
			return fmt.Errorf("marking redriven sessions: %w", err)
		}
		now := time.Now().UTC()
		wakes := make([]outbox.Row, n)
		for i, s := range sessions {
			wakes[i] = outbox.WakeRow(r.cfg.Topics.Wakes, s, "redrive", now)
		}
		return outbox.Insert(ctx, tx, wakes...)
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return n, left, after, nil
}

// lostWakeSQL is what makes a session's waiting inputs a lost wake, the
// one predicate of the redrive scan, its plan and its count (i: the
// waiting input, r: its session): admitted more than RedriveAfter ($1)
// ago, no redrive of the session within it, no claim. A timestamp the
// column admits that is not a time is read as such (invariant 10): an
// admitted_at of 'infinity' is due (no clock ever passes it, and a wake
// for a waiting input is harmless: the claim gates execution; P1), and
// so is a session whose redriven_at is 'infinity' (no clock tells when it
// was redriven; the redrive sets a time). '-infinity' is older than any
// clock already. Equalities, not isfinite(), so that the scan still reads
// waiting inputs through their partial index of admitted_at.
const lostWakeSQL = `
    (i.admitted_at < now() - $1 * interval '1 millisecond' OR i.admitted_at = 'infinity')
    AND (r.redriven_at IS NULL OR r.redriven_at < now() - $1 * interval '1 millisecond' OR r.redriven_at = 'infinity')
    AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = i.session_id)`

// The filters (no claim, not redriven within the interval) apply before the
// limit: a session that cannot be redriven — a quarantined or long-running
// claim, a recent redrive — never takes a place in the batch, so however
// many there are, a lost wake behind them is found (invariant 10). The old
// waiting inputs are read through their partial index, as before
// (TestRedriveScanUsesTheRedriveIndex). The outer filters are checked again
// on the locked row (a concurrent pass may have redriven it meanwhile).
// Sessions are locked in sorted order (as admission does) and skipped when
// busy: a concurrent pass or admission is handling them. A session whose
// oldest waiting input was admitted at 'infinity' comes last.
const redriveSQL = `
SELECT s.session_id FROM sessions s
WHERE s.session_id IN (
    SELECT i.session_id FROM waiting_inputs i
    JOIN sessions r ON r.session_id = i.session_id
    WHERE` + lostWakeSQL + `
      AND ($3 = '' OR i.session_id = $3)
    GROUP BY i.session_id
    ORDER BY min(i.admitted_at), i.session_id
    LIMIT $2)
  AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = s.session_id)
  AND (s.redriven_at IS NULL OR s.redriven_at < now() - $1 * interval '1 millisecond' OR s.redriven_at = 'infinity')
ORDER BY s.session_id
FOR UPDATE SKIP LOCKED`

// redrivePlanSQL is redriveSQL's selection read without locks (a plan runs
// read only), with what the plan shows of each session; $3, when not
// empty, keeps that session only. The oldest admission is NULL when it is
// not a time, and its value in words ('-infinity', 'infinity': the column
// admits them) is beside it, so that one odd row fails no plan.
const redrivePlanSQL = `
SELECT i.session_id, count(*)::int, CASE WHEN isfinite(min(i.admitted_at)) THEN min(i.admitted_at) END,
       CASE WHEN NOT isfinite(min(i.admitted_at)) THEN min(i.admitted_at)::text ELSE '' END
FROM waiting_inputs i
JOIN sessions r ON r.session_id = i.session_id
WHERE` + lostWakeSQL + `
  AND ($3 = '' OR i.session_id = $3)
GROUP BY i.session_id
ORDER BY min(i.admitted_at), i.session_id
LIMIT $2`

// lostWakesCountSQL counts the sessions redrivePlanSQL selects, whole: one
// aggregate, no row per session read out; $2, when not empty, keeps that
// session only.
const lostWakesCountSQL = `
SELECT count(DISTINCT i.session_id)::int FROM waiting_inputs i
JOIN sessions r ON r.session_id = i.session_id
WHERE` + lostWakeSQL + `
  AND ($2 = '' OR i.session_id = $2)`
