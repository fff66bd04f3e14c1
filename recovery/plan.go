package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// DecisionRedriven is a plan's decision for a lost wake: the session's
// waiting inputs have no claim and no wake on its way, and a pass wakes it
// again (Pass.Redriven).
const DecisionRedriven DecisionKind = "redriven"

// PlanOpts narrows a plan.
type PlanOpts struct {
	// SessionID plans for one session only. Defaults to every session.
	SessionID string
	// All plans every expired claim and lost wake, in pages of Batch in
	// the one snapshot, not the one batch a pass handles: what waits
	// after a fleet-wide crash. Its cost grows with the backlog (six
	// indexed reads per expired claim). Defaults to one batch.
	All bool

	// after, when set, keeps the claims after it in the pass's order
	// (expires_at, session_id): an apply pages on past the claims it has
	// seen, so that claims it leaves (another decision, changed since)
	// cannot hide the rest behind the batch bound.
	after *claimCursor
}

// claimCursor is a position in the pass's order of expired claims.
type claimCursor struct {
	expiresAt time.Time
	notFinite string // expires_at when it is not a time (expiresAt is zero)
	sessionID string
}

// cursorAfter is the position of a planned claim in the pass's order.
func cursorAfter(c PlannedClaim) *claimCursor {
	return &claimCursor{expiresAt: c.Evidence.ExpiredAt, notFinite: c.Evidence.ExpiredAtNotFinite, sessionID: c.SessionID}
}

// Plan is what a recovery pass would do now, decided by the pass's own
// function (Decide) on evidence read in one snapshot; nothing is written.
type Plan struct {
	// At is when the snapshot was taken (the database's clock).
	At time.Time `json:"at"`
	// Claims are the expired claims a pass would handle, in its order.
	Claims []PlannedClaim `json:"claims"`
	// LostWakes are the sessions a pass would wake again.
	LostWakes []LostWake `json:"lost_wakes"`
}

// PlannedClaim is an expired claim, the decision a pass would take on it
// and the evidence that decision rests on.
type PlannedClaim struct {
	SessionID   string `json:"session_id"`
	ExecutionID string `json:"execution_id"`
	Token       int64  `json:"fencing_token"`
	Decision
	Evidence Evidence `json:"evidence"`
}

// LostWake is a session a pass would wake again.
type LostWake struct {
	SessionID     string       `json:"session_id"`
	Decision      DecisionKind `json:"decision"`
	WaitingInputs int          `json:"waiting_inputs"`
	// OldestWaiting is when the oldest waiting input was admitted; zero
	// when its admitted_at is not a time (a hand edit, a restore), which
	// the plan reads without failing.
	OldestWaiting time.Time `json:"oldest_waiting_admitted_at"`
	// OldestWaitingNotFinite is that admitted_at when it is not a time
	// ('-infinity', 'infinity'), as Evidence.ExpiredAtNotFinite is a
	// claim's expires_at; such a wake is due whatever the clock.
	OldestWaitingNotFinite string `json:"oldest_waiting_admitted_at_not_finite,omitempty"`
}

// Plan reads, in one REPEATABLE READ READ ONLY transaction, what a pass
// would handle now (the same bounded scans, Config.Batch) and decides on
// it with Decide, as the pass does. It takes no lock and writes nothing:
// a pass that runs after it decides afresh on what it finds then, so a
// plan that went stale (a claim renewed, taken over, or released since)
// is never acted on.
func (r *Recoverer) Plan(ctx context.Context, opts *PlanOpts) (Plan, error) {
	if opts == nil {
		opts = &PlanOpts{}
	}
	plan := Plan{Claims: []PlannedClaim{}, LostWakes: []LostWake{}}
	err := r.snapshot(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&plan.At); err != nil {
			return fmt.Errorf("reading the plan's clock: %w", err)
		}
		after := opts.after
		for {
			claims, err := r.planClaims(ctx, tx, opts.SessionID, after)
			if err != nil {
				return err
			}
			plan.Claims = append(plan.Claims, claims...)
			if !opts.All || len(claims) < r.cfg.Batch {
				break
			}
			after = cursorAfter(claims[len(claims)-1])
		}
		limit := &r.cfg.Batch
		if opts.All {
			limit = nil // LIMIT NULL: every lost wake
		}
		rows, err := tx.Query(ctx, redrivePlanSQL, r.cfg.RedriveAfter.Milliseconds(), limit, opts.SessionID)
		if err != nil {
			return fmt.Errorf("planning lost wakes: %w", err)
		}
		var w LostWake
		var oldest *time.Time
		if _, err := pgx.ForEachRow(rows, []any{&w.SessionID, &w.WaitingInputs, &oldest, &w.OldestWaitingNotFinite}, func() error {
			w.Decision, w.OldestWaiting = DecisionRedriven, time.Time{}
			if oldest != nil {
				w.OldestWaiting = *oldest
			}
			plan.LostWakes = append(plan.LostWakes, w)
			return nil
		}); err != nil {
			return fmt.Errorf("planning lost wakes: %w", err)
		}
		return nil
	})
	return plan, err
}

// snapshot runs fn in one REPEATABLE READ READ ONLY transaction: what it
// reads is one consistent state, and it can write nothing.
func (r *Recoverer) snapshot(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("beginning the plan's snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("ending the plan's snapshot: %w", err)
	}
	return nil
}

// planClaims decides, with Decide as the pass does, on one page (Batch) of
// the expired claims in the pass's order, after the cursor when not nil.
func (r *Recoverer) planClaims(ctx context.Context, tx pgx.Tx, sessionID string, after *claimCursor) ([]PlannedClaim, error) {
	claims, err := scanExpired(ctx, tx, r.cfg.Batch, sessionID, after)
	if err != nil {
		return nil, err
	}
	out := make([]PlannedClaim, 0, len(claims))
	for _, c := range claims {
		ev, err := r.gatherAlone(ctx, tx, c)
		var d Decision
		switch {
		case err == nil:
			d = Decide(c, ev, r.cfg.IdempotentProviders)
		case ctx.Err() != nil || pgdb.Transient(err):
			return nil, fmt.Errorf("planning %s: %w", c.SessionID, err)
		default:
			// A row whose evidence cannot be read (a value the columns
			// admit and the decision cannot: a hand edit, a bug's row) is
			// planned as the pass decides it, quarantined, and the page
			// goes on: failing the page, it would stop every plan, every
			// apply and the held gauge at that row (invariant 10).
			d = Decision{Decision: DecisionQuarantined, QuarantineReason: "decision failed: " + err.Error(), failed: true}
		}
		out = append(out, PlannedClaim{SessionID: c.SessionID, ExecutionID: c.ExecutionID, Token: c.Token,
			Decision: d, Evidence: ev})
	}
	return out, nil
}

// gatherAlone is gather under a savepoint of tx: a statement the server
// refuses aborts only the savepoint, so that the page's other claims are
// still read in tx.
func (r *Recoverer) gatherAlone(ctx context.Context, tx pgx.Tx, c ledger.Claim) (Evidence, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Evidence{}, err
	}
	ev, err := r.gather(ctx, sp, c)
	if err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return ev, fmt.Errorf("%w (and rolling back to the savepoint: %w)", err, rerr)
		}
		return ev, err
	}
	return ev, sp.Commit(ctx)
}

// scanExpired reads the expired claims a pass handles, bounded and in its
// order; sessionID, when not empty, keeps that session's only, and after,
// when not nil, the claims after it in that order.
func scanExpired(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, batch int, sessionID string, after *claimCursor) ([]ledger.Claim, error) {
	p := &ledger.ExpiredClaimsParams{Limit: batch, SessionID: sessionID}
	if after != nil {
		p.AfterExpiresAt, p.AfterExpiresNotFinite, p.AfterSessionID = &after.expiresAt, after.notFinite, after.sessionID
	}
	return ledger.ExpiredClaims(ctx, q, p)
}

// WritePlan writes a plan in the words of `recovery explain`.
func WritePlan(w io.Writer, p Plan) {
	fmt.Fprintf(w, "Recovery plan at %s (nothing has been written).\n", p.At.UTC().Format(time.RFC3339))
	if len(p.Claims) == 0 && len(p.LostWakes) == 0 {
		fmt.Fprintln(w, "No expired claims and no lost wakes: a pass would do nothing.")
		return
	}
	for _, c := range p.Claims {
		rec := Record{ExecutionID: c.ExecutionID, SessionID: c.SessionID, PhaseFound: c.Evidence.Phase, Decision: c.Decision.Decision,
			Rule: c.Rule, Evidence: c.Evidence, ContinuationID: c.ContinuationID, RetryAttemptID: c.RetryAttemptID,
			QuarantineReason: c.QuarantineReason}
		fmt.Fprintf(w, "Session %s: execution %s (owner %s) expired at %s in phase %q.\n",
			c.SessionID, c.ExecutionID, c.Evidence.Owner, c.Evidence.expiredAtText(), c.Evidence.Phase)
		fmt.Fprintf(w, "  Would decide: %s — %s\n", rec.Decision, because(rec))
		explainEvidence(w, c.Evidence)
		if c.ContinuationID != "" {
			fmt.Fprintf(w, "  Continuation input %s: would be admitted.\n", c.ContinuationID)
		}
	}
	for _, l := range p.LostWakes {
		oldest := l.OldestWaitingNotFinite
		if oldest == "" {
			oldest = l.OldestWaiting.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "Session %s: %d inputs wait (the oldest admitted at %s) with no claim and no wake on its way.\n",
			l.SessionID, l.WaitingInputs, oldest)
		fmt.Fprintf(w, "  Would decide: %s — its wake was lost; the session is woken again.\n", l.Decision)
	}
}
