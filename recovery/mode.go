package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
)

// Recovery modes.
const (
	// ModeAuto: passes take over expired claims and re-wake lost wakes.
	ModeAuto = "auto"
	// ModeHold: passes only plan; an operator applies (Apply).
	ModeHold = "hold"
)

// ModeSetting is the fleet's recovery mode as an operator set it.
type ModeSetting struct {
	Mode  string `json:"mode"`
	SetBy string `json:"set_by"`
	Note  string `json:"note,omitempty"`
	// SetAt is read as what the column holds, a time or not (a hand
	// edit): every pass reads the mode first, so a read that failed on it
	// would stop every pass of every consumer (invariant 10).
	SetAt pgdb.Time `json:"set_at"`
	// SetAtNotFinite is set_at when it is not a time ('-infinity',
	// 'infinity'), SetAt then zero, as Evidence.ExpiredAtNotFinite is a
	// claim's expires_at.
	SetAtNotFinite string `json:"set_at_not_finite,omitempty"`
}

// Mode reads the fleet's recovery mode; ok is false when no operator ever
// set it (each process then runs in its Config.Mode).
func Mode(ctx context.Context, pool *pgxpool.Pool) (s ModeSetting, ok bool, err error) {
	err = pool.QueryRow(ctx, `SELECT mode, set_by, coalesce(note, ''), set_at FROM recovery_mode`).Scan(&s.Mode, &s.SetBy, &s.Note, &s.SetAt)
	if errors.Is(interpretError(err), errNotFound) {
		return ModeSetting{}, false, nil
	}
	if err != nil {
		return ModeSetting{}, false, fmt.Errorf("reading the recovery mode: %w", err)
	}
	s.SetAtNotFinite = s.SetAt.NotFinite
	return s, true, nil
}

// SetMode sets the fleet's recovery mode (ModeAuto or ModeHold), audited in
// recovery_actions in the same transaction. Every pass reads it, so every
// consumer follows within one pass.
func SetMode(ctx context.Context, pool *pgxpool.Pool, mode, operator, note string) error {
	if mode != ModeAuto && mode != ModeHold {
		return fmt.Errorf("recovery mode: %q is neither %s nor %s", mode, ModeAuto, ModeHold)
	}
	if operator == "" {
		return errors.New("recovery mode: an operator must be named")
	}
	action := "resume"
	if mode == ModeHold {
		action = "hold"
	}
	return pgdb.InTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO recovery_mode (mode, set_by, note) VALUES ($1, $2, nullif($3, ''))
			ON CONFLICT (singleton) DO UPDATE SET mode = excluded.mode, set_by = excluded.set_by, note = excluded.note, set_at = now()`,
			mode, operator, note); err != nil {
			return fmt.Errorf("setting the recovery mode: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO recovery_actions (action, operator, note) VALUES ($1, $2, nullif($3, ''))`,
			action, operator, note); err != nil {
			return fmt.Errorf("auditing the recovery mode: %w", err)
		}
		return nil
	})
}

// mode is the mode this pass runs in: the operators' row when set, else
// Config.Mode.
func (r *Recoverer) mode(ctx context.Context) (string, error) {
	s, ok, err := Mode(ctx, r.pool)
	if err != nil {
		return "", err
	}
	if ok {
		return s.Mode, nil
	}
	return r.cfg.Mode, nil
}

// heldScan is a held pass's count of the expired claims that wait, by
// decision, kept between passes: a scan longer than Config.HeldPages pages
// goes on where the last pass stopped.
type heldScan struct {
	after   *claimCursor         // where the running scan goes on; nil: from the start
	running map[DecisionKind]int // the running scan's counts so far
	last    map[DecisionKind]int // the last whole scan's counts; nil before one ended
}

// held plans instead of acting and reports what waits, by decision: every
// expired claim (decided by Decide on its evidence, as a pass would) and
// every lost wake, not one batch.
//
// Cost per pass, bounded: at most Config.HeldPages pages of Config.Batch
// expired claims, each page one range scan of the claims' expiry index and
// the pass's six indexed reads per claim (gather; eight with the cap), plus one aggregate over
// the waiting inputs older than RedriveAfter (their partial index) for the
// lost wakes, all in one read-only snapshot that takes no lock. Up to
// HeldPages×Batch expired claims (1,000 by default) every pass counts them
// all afresh; beyond that a scan spans several passes (one page range per
// pass, in the pass's order, which claims that expire later join at its
// end), the gauge shows the last whole scan's counts, and a growing lower
// bound until the first scan ends.
func (r *Recoverer) held(ctx context.Context) (map[DecisionKind]int, error) {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	h := &r.heldScan
	if h.running == nil {
		h.running = map[DecisionKind]int{}
	}
	var lostWakes int
	err := r.snapshot(ctx, func(tx pgx.Tx) error {
		for range r.cfg.HeldPages {
			page, err := r.planClaims(ctx, tx, "", h.after)
			if err != nil {
				return err
			}
			for _, c := range page {
				h.running[c.Decision.Decision]++
			}
			if len(page) < r.cfg.Batch {
				h.last, h.running, h.after = h.running, map[DecisionKind]int{}, nil
				break
			}
			h.after = cursorAfter(page[len(page)-1])
		}
		if err := tx.QueryRow(ctx, lostWakesCountSQL, r.cfg.RedriveAfter.Milliseconds(), "").Scan(&lostWakes); err != nil {
			return fmt.Errorf("counting lost wakes: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	counts := h.last
	if counts == nil {
		counts = h.running
	}
	out := maps.Clone(counts)
	if lostWakes > 0 {
		out[DecisionRedriven] = lostWakes
	}
	return out, nil
}

// Waiting counts, by decision, everything a pass would handle now (the
// lost wakes as DecisionRedriven), every page of expired claims decided in
// one read-only snapshot, as Plan decides them; opts.SessionID narrows it.
// Its cost grows with the backlog (six indexed reads (eight with the recovery cap) per expired claim):
// it is for an operator's command (apply's progress bar), not a pass.
func (r *Recoverer) Waiting(ctx context.Context, opts *PlanOpts) (map[DecisionKind]int, error) {
	if opts == nil {
		opts = &PlanOpts{}
	}
	out := map[DecisionKind]int{}
	err := r.snapshot(ctx, func(tx pgx.Tx) error {
		var after *claimCursor
		for {
			page, err := r.planClaims(ctx, tx, opts.SessionID, after)
			if err != nil {
				return err
			}
			for _, c := range page {
				out[c.Decision.Decision]++
			}
			if len(page) < r.cfg.Batch {
				break
			}
			after = cursorAfter(page[len(page)-1])
		}
		var n int
		if err := tx.QueryRow(ctx, lostWakesCountSQL, r.cfg.RedriveAfter.Milliseconds(), opts.SessionID).Scan(&n); err != nil {
			return fmt.Errorf("counting lost wakes: %w", err)
		}
		if n > 0 {
			out[DecisionRedriven] = n
		}
		return nil
	})
	return out, err
}

// forgetHeld drops a held scan: a pass in auto acts, and a later hold
// counts afresh.
func (r *Recoverer) forgetHeld() {
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	r.heldScan = heldScan{}
}

// Counts are the plan's decisions, counted (lost wakes as DecisionRedriven).
func (p Plan) Counts() map[DecisionKind]int {
	out := map[DecisionKind]int{}
	for _, c := range p.Claims {
		out[c.Decision.Decision]++
	}
	if len(p.LostWakes) > 0 {
		out[DecisionRedriven] += len(p.LostWakes)
	}
	return out
}

// ApplyOpts bound an operator's apply.
type ApplyOpts struct {
	// SessionID applies one session's only. Defaults to every session.
	SessionID string
	// Decision applies only the claims a pass decides so (or, with
	// DecisionRedriven, the lost wakes). Defaults to every decision.
	Decision DecisionKind
	// Rate bounds the decisions applied per second. Defaults to 10.
	Rate float64
	// Max bounds the decisions applied by this run. Defaults to no bound.
	Max int
	// Operator and Note are audited; Operator is required.
	Operator string
	Note     string
	// OnProgressFunc is told after each applied item. Defaults to nothing.
	OnProgressFunc func(applied int, last string)
}

// Applied reports an apply run.
type Applied struct {
	ID        int64                `json:"id"`
	Decisions map[DecisionKind]int `json:"decisions"`
	Skipped   int                  `json:"skipped"`
	// Retried counts the claims and lost wakes left as they were after a
	// transient database error (invariant 13); a later run applies them.
	Retried int `json:"retried"`
	// Failed counts the claims whose decision failed deterministically:
	// quarantined ("decision failed: ...") as a pass does when the run has
	// no decision filter, else left as they were.
	Failed int `json:"failed"`
}

// Apply applies, in any mode, what a pass would do now, one claim or lost
// wake per transaction through the pass's own code (gather, Decide, apply
// under the session's lock), at most Rate per second and Max in all,
// audited in recovery_actions and in each decision's recovered_by. A claim
// whose decision, decided again in its transaction, is not the one asked
// for is left alone; one that meets a transient error is left for a later
// run, and one whose decision fails for good is quarantined as a pass does
// (left, with a decision filter), and the run goes on. Nothing it writes depends on the plan that listed the
// claim: a crash between plan and apply, or in the middle of a run, leaves
// the rest for the next run, which applies only what is left.
func (r *Recoverer) Apply(ctx context.Context, opts *ApplyOpts) (Applied, error) {
	res := Applied{Decisions: map[DecisionKind]int{}}
	if opts.Operator == "" {
		return res, errors.New("recovery apply: an operator must be named")
	}
	rate := opts.Rate
	if rate <= 0 {
		rate = 10
	}
	err := r.pool.QueryRow(ctx, `INSERT INTO recovery_actions (action, operator, note, session_id, decision)
		VALUES ('apply', $1, nullif($2, ''), nullif($3, ''), nullif($4, '')) RETURNING id`,
		opts.Operator, opts.Note, opts.SessionID, opts.Decision).Scan(&res.ID)
	if err != nil {
		return res, fmt.Errorf("auditing the apply: %w", err)
	}
	cfg := r.cfg
	cfg.OwnerID = fmt.Sprintf("apply#%d:%s", res.ID, opts.Operator)
	// The operator's --rate paces the run, not the fleet's bucket
	// (Config.Rate bounds automatic passes only).
	cfg.Rate = 0
	applier := &Recoverer{pool: r.pool, cfg: cfg, log: r.log}
	applied := 0
	defer func() {
		_, err := r.pool.Exec(context.WithoutCancel(ctx), `UPDATE recovery_actions SET applied = $2, finished_at = now() WHERE id = $1`, res.ID, applied)
		if err != nil {
			r.log.WarnContext(ctx, "recording the apply's end failed", slog.Any("error", err))
		}
	}()
	every := time.Duration(float64(time.Second) / rate)
	var next time.Time
	wait := func() error {
		if d := time.Until(next); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
		next = time.Now().Add(every)
		return nil
	}
	full := func() bool { return opts.Max > 0 && applied >= opts.Max }
	tried := map[string]bool{}
	var after *claimCursor
	for !full() {
		plan, err := r.Plan(ctx, &PlanOpts{SessionID: opts.SessionID, after: after})
		if err != nil {
			return res, err
		}
		progressed := false
		if n := len(plan.Claims); n > 0 {
			// The next plan pages on past these, whatever becomes of
			// them: a claim left here (another decision, changed since)
			// must not keep the rest behind the batch bound.
			after = cursorAfter(plan.Claims[n-1])
			progressed = true
		}
		for _, c := range plan.Claims {
			if full() || tried[c.ExecutionID] || (opts.Decision != "" && c.Decision.Decision != opts.Decision) {
				continue
			}
			tried[c.ExecutionID] = true
			progressed = true
			if err := wait(); err != nil {
				return res, err
			}
			claim := ledger.Claim{SessionID: c.SessionID, ExecutionID: c.ExecutionID, OwnerID: c.Evidence.Owner, Token: c.Token,
				Phase: ledger.Phase(c.Evidence.Phase), AssistantMessageID: c.Evidence.AssistantMessageID, ExpiresAt: c.Evidence.ExpiredAt,
				ExpiresNotFinite: c.Evidence.ExpiredAtNotFinite}
			d, _, err := applier.recoverOnly(ctx, claim, opts.Decision)
			switch {
			case errors.Is(err, errSkipped):
				res.Skipped++
				continue
			case err != nil && ctx.Err() != nil:
				return res, ctx.Err()
			case err != nil && pgdb.Transient(err):
				// Nothing about the claim (invariant 13): it is as it
				// was, and a later run applies it.
				res.Retried++
				r.transientError(ctx, claim, "applying failed transiently; the claim is left for a later run", err)
				continue
			case err != nil:
				res.Failed++
				if opts.Decision != "" {
					// Quarantining would be another decision than the
					// one asked for: left, and the run goes on.
					r.log.ErrorContext(ctx, "applying failed; the claim is left as it was",
						slog.String("session_id", c.SessionID), slog.String("execution_id", c.ExecutionID), slog.Any("error", err))
					continue
				}
				// As a pass does: isolate the failure, so that it cannot
				// stop this run and every later one at this claim.
				r.log.ErrorContext(ctx, "applying failed; quarantining the claim",
					slog.String("session_id", c.SessionID), slog.String("execution_id", c.ExecutionID), slog.Any("error", err))
				qerr := applier.quarantineClaim(ctx, claim, "decision failed: "+err.Error())
				switch {
				case errors.Is(qerr, errSkipped):
					res.Skipped++
					continue
				case qerr != nil && ctx.Err() != nil:
					return res, ctx.Err()
				case qerr != nil && pgdb.Transient(qerr):
					res.Retried++
					r.transientError(ctx, claim, "quarantining the claim failed transiently; it is left for a later run", qerr)
					continue
				case qerr != nil:
					return res, fmt.Errorf("quarantining %s after a failed decision: %w", c.SessionID, qerr)
				}
				d = DecisionQuarantined
			}
			applied++
			res.Decisions[d]++
			if f := r.cfg.OnDecisionFunc; f != nil {
				f(d)
			}
			if f := opts.OnProgressFunc; f != nil {
				f(applied, c.SessionID+": "+string(d))
			}
		}
		if opts.Decision == "" || opts.Decision == DecisionRedriven {
			for _, w := range plan.LostWakes {
				if full() || tried["wake:"+w.SessionID] {
					continue
				}
				tried["wake:"+w.SessionID] = true
				progressed = true
				if err := wait(); err != nil {
					return res, err
				}
				n, err := applier.redriveSession(ctx, w.SessionID)
				switch {
				case err != nil && ctx.Err() != nil:
					return res, ctx.Err()
				case err != nil && pgdb.Transient(err):
					res.Retried++
					r.transientError(ctx, ledger.Claim{SessionID: w.SessionID}, "re-waking failed transiently; the session is left for a later run", err)
					continue
				case err != nil:
					return res, fmt.Errorf("re-waking %s: %w", w.SessionID, err)
				}
				if n == 0 {
					res.Skipped++
					continue
				}
				applied++
				res.Decisions[DecisionRedriven]++
				if f := r.cfg.OnRedriveFunc; f != nil {
					f(n)
				}
				if f := opts.OnProgressFunc; f != nil {
					f(applied, w.SessionID+": "+string(DecisionRedriven))
				}
			}
		}
		if applied > 0 && r.cfg.OnCommitFunc != nil {
			r.cfg.OnCommitFunc()
		}
		if !progressed {
			break
		}
	}
	return res, nil
}
