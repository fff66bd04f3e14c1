package recovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/ledger"
)

// Config configures a Recoverer.
type Config struct {
	// Interval between passes. Defaults to 10s.
	Interval time.Duration
	// Batch bounds the expired claims and the lost wakes handled per pass.
	// Defaults to 100.
	Batch int
	// RedriveAfter is how old a waiting input without a claim must be
	// before its session is woken again. Defaults to 30s.
	RedriveAfter time.Duration
	// OwnerID names this process in takeovers. Defaults to "recovery".
	OwnerID string
	// RoundTripTimeout bounds each pass of the loop (its context has no
	// deadline): a connection gone silent under a pass (a partition, a
	// failover with no reset) would otherwise hold this process's
	// recovery until the kernel gave the connection up (about 15
	// minutes). A pass given up leaves what it did not decide for the
	// next; a decision given up is in doubt and the next pass's
	// compare-and-swap finds it done or not (invariant 9). Defaults to
	// pgdb.RoundTripTimeoutDefault.
	RoundTripTimeout time.Duration
	// Topics names the outbox targets. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// IdempotentProviders names the providers (as recorded on attempts)
	// that honour idempotency keys. Defaults to none.
	IdempotentProviders []string
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnDecisionFunc counts decisions (metrics). Defaults to nothing.
	OnDecisionFunc func(decision DecisionKind)
	// OnTransientErrorFunc counts decisions that failed with a transient
	// database error (pgdb.Transient) and were left for the next pass.
	// Defaults to nothing.
	OnTransientErrorFunc func()
	// OnRedriveFunc counts re-woken sessions. Defaults to nothing.
	OnRedriveFunc func(n int)
	// OnAttemptUnknownFunc counts each provider attempt that a committed
	// decision marked unknown (reconciled, or sent again with its
	// idempotency key), by provider and model. Defaults to nothing.
	OnAttemptUnknownFunc func(provider, model string)
	// OnAtRiskFunc receives, after each pass, the attempts left unknown by
	// provider and model, read from the database (ledger.AttemptsAtRisk).
	// Defaults to nothing.
	OnAtRiskFunc func(atRisk []ledger.AtRisk)
	// OnQuarantinedFunc receives the quarantined row counts by kind after
	// each pass, read from the database. Defaults to nothing.
	OnQuarantinedFunc func(counts map[string]int)
	// OnCommitFunc runs after a pass that wrote outbox rows (the relay's
	// Nudge). Defaults to nothing.
	OnCommitFunc func()
	// Mode is ModeAuto or ModeHold, used while no operator has set the
	// fleet's mode (SetMode: that row wins). Defaults to ModeAuto.
	Mode string
	// OnHeldFunc receives, after each pass, what waits by decision: the
	// plan of a held pass, empty in auto. Defaults to nothing.
	OnHeldFunc func(counts map[DecisionKind]int)
	// HeldPages bounds the pages of Batch expired claims a held pass
	// plans (decides on, without acting) to count what waits; a scan
	// longer than that goes on at the next pass. Defaults to 10.
	HeldPages int
	// MaxPerSession caps the recoveries that run a session's turn again
	// (continued, rewoken) within MaxPerSessionWindow and since the
	// session last made progress (a step answered, a turn ended): a claim
	// whose session had that many already is quarantined with ReasonRecoveryCap
	// instead (a turn that crashes its process each time it runs must not
	// loop forever). Defaults to 0: no cap.
	MaxPerSession int
	// MaxPerSessionWindow is the window of MaxPerSession. Defaults to 1h.
	MaxPerSessionWindow time.Duration
	// OnCappedFunc counts claims quarantined by MaxPerSession. Defaults to
	// nothing.
	OnCappedFunc func()
	// Rate bounds, per second and across every recoverer on the database
	// (a token bucket in Postgres: rate.go), the decisions of automatic
	// passes that wake a session (paced): continuations, re-armed ready
	// claims, decisions whose session has inputs waiting, and re-wakes of
	// lost wakes. A pass waits for tokens, holding no lock, for at most
	// Interval, and leaves what is left for the next pass (expired claims
	// and lost wakes as they were). An operator's Apply is paced by its
	// own ApplyOpts.Rate instead. Defaults to 0: unbounded.
	Rate float64
	// OnDeferredFunc counts what a pass left for the next one for want of
	// a token, by kind (claim or wake). Defaults to nothing.
	OnDeferredFunc func(kind string, n int)
}

// Recoverer runs recovery passes.
type Recoverer struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	loop startstop.Loop

	heldMu   sync.Mutex
	heldScan heldScan
}

// New returns a Recoverer.
func New(pool *pgxpool.Pool, config *Config) *Recoverer {
	cfg := *config
	cfg.Interval = cmp.Or(cfg.Interval, IntervalDefault)
	cfg.Batch = cmp.Or(cfg.Batch, BatchDefault)
	cfg.RedriveAfter = cmp.Or(cfg.RedriveAfter, RedriveAfterDefault)
	cfg.OwnerID = cmp.Or(cfg.OwnerID, "recovery")
	cfg.RoundTripTimeout = cmp.Or(cfg.RoundTripTimeout, pgdb.RoundTripTimeoutDefault)
	cfg.Mode = cmp.Or(cfg.Mode, ModeAuto)
	cfg.HeldPages = cmp.Or(cfg.HeldPages, 10)
	cfg.MaxPerSessionWindow = cmp.Or(cfg.MaxPerSessionWindow, MaxPerSessionWindowDefault)
	cfg.Topics = cfg.Topics.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Recoverer{pool: pool, cfg: cfg, log: cfg.Logger}
}

// Start runs a pass at once and then every Interval, in a goroutine,
// until Stop or ctx ends; it returns at once, and fails while the loop
// runs. A stopped recoverer may be started again.
func (r *Recoverer) Start(ctx context.Context) error {
	if err := r.loop.Start(ctx, r.run); err != nil {
		return fmt.Errorf("recovery: %w", err)
	}
	return nil
}

// Stop ends the loop, cancelling a pass under way, and waits for it; it
// may be called twice, and before Start.
func (r *Recoverer) Stop() { r.loop.Stop() }

func (r *Recoverer) run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.RoundTripTimeout)
		_, err := r.RunOnce(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "recovery pass failed", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass reports one pass.
//
// Its JSON (`consumer recover --json`, docs/runbook.md) has snake_case
// keys, as every operator command's JSON.
type Pass struct {
	Decisions map[DecisionKind]int `json:"decisions"`
	Skipped   int                  `json:"skipped"`  // taken over by another process first
	Failed    int                  `json:"failed"`   // decision failed deterministically; the row was quarantined
	Retried   int                  `json:"retried"`  // decision failed transiently; the row is left for the next pass
	Redriven  int                  `json:"redriven"` // sessions re-woken because their wake was lost
	// Deferred counts the claims and lost wakes left for the next pass
	// for want of a recovery token (Config.Rate).
	Deferred int `json:"deferred,omitempty"`
	// Held is what a pass in hold planned and left, by decision (lost
	// wakes as DecisionRedriven); empty in auto.
	Held map[DecisionKind]int `json:"held,omitempty"`
}

// RunOnce runs one bounded pass: expired claims, then lost wakes, then the
// gauges. The three are independent: a failure of one (a scan that fails)
// holds back neither of the others, and the pass returns the failures
// joined (invariant 10).
func (r *Recoverer) RunOnce(ctx context.Context) (Pass, error) {
	p := Pass{Decisions: map[DecisionKind]int{}}
	mode, err := r.mode(ctx)
	if err != nil {
		return p, err
	}
	if mode == ModeHold {
		// Held: plan only, take nothing over, wake nothing; an operator
		// applies (Apply) or resumes.
		held, err := r.held(ctx)
		if err == nil {
			p.Held = held
			r.log.DebugContext(ctx, "recovery pass held", slog.Any("held", p.Held))
			if f := r.cfg.OnHeldFunc; f != nil {
				f(p.Held)
			}
		}
		if ctx.Err() != nil {
			return p, errors.Join(err, ctx.Err())
		}
		return p, errors.Join(err, r.reportQuarantined(ctx))
	}
	r.forgetHeld()
	if f := r.cfg.OnHeldFunc; f != nil {
		f(map[DecisionKind]int{})
	}
	// The pass waits for recovery tokens at most one interval: what it
	// cannot decide by then is the next pass's.
	deadline := time.Now().Add(r.cfg.Interval)
	if r.cfg.Rate > 0 {
		if _, err := r.pool.Exec(ctx, ensureBucketSQL); err != nil {
			// Both halves of the pass take tokens from the bucket.
			err = fmt.Errorf("checking the recovery bucket: %w", err)
			if ctx.Err() != nil {
				return p, err
			}
			return p, errors.Join(err, r.reportQuarantined(ctx))
		}
	}
	wrote, claimsErr := r.claimsPass(ctx, &p, deadline)
	if ctx.Err() != nil {
		return p, cmp.Or(claimsErr, ctx.Err())
	}
	n, deferred, redriveErr := r.redrivePaced(ctx, deadline)
	p.Redriven = n
	if deferred > 0 {
		p.Deferred += deferred
		if f := r.cfg.OnDeferredFunc; f != nil {
			f("wake", deferred)
		}
	}
	if n > 0 && r.cfg.OnRedriveFunc != nil {
		r.cfg.OnRedriveFunc(n)
	}
	if (wrote || n > 0) && r.cfg.OnCommitFunc != nil {
		r.cfg.OnCommitFunc()
	}
	if ctx.Err() != nil {
		return p, errors.Join(claimsErr, redriveErr, ctx.Err())
	}
	return p, errors.Join(claimsErr, redriveErr, r.reportQuarantined(ctx))
}

// claimsPass decides the expired claims of one pass (a batch), counting
// in p; wrote says that a decision committed. An error is the scan's, or
// the context's: a claim's own failure is isolated (quarantined, or left
// for the next pass when transient).
func (r *Recoverer) claimsPass(ctx context.Context, p *Pass, deadline time.Time) (wrote bool, err error) {
	claims, err := r.expired(ctx)
	if err != nil {
		return false, err
	}
	for _, c := range claims {
		decision, failed, err := r.recoverPaced(ctx, c, deadline)
		switch {
		case errors.Is(err, errSkipped):
			p.Skipped++
		case errors.Is(err, errDeferred):
			p.Deferred++
			if f := r.cfg.OnDeferredFunc; f != nil {
				f("claim", 1)
			}
		case err != nil:
			if ctx.Err() != nil {
				return wrote, ctx.Err()
			}
			if pgdb.Transient(err) {
				// A lost connection, a timeout, a deadlock: nothing about
				// the claim (invariant 13). The transaction rolled back, so
				// the claim is as it was; the next pass decides it.
				p.Retried++
				r.transientError(ctx, c, "recovery decision failed transiently; the claim is left for the next pass", err)
				continue
			}
			// Isolate the failure: quarantine the row so it cannot consume
			// every later batch, and go on.
			r.log.ErrorContext(ctx, "recovery decision failed; quarantining the claim",
				slog.String("session_id", c.SessionID), slog.String("execution_id", c.ExecutionID), slog.Any("error", err))
			qerr := r.quarantineClaim(ctx, c, "decision failed: "+err.Error())
			switch {
			case qerr == nil:
				p.Failed++
				p.Decisions[DecisionQuarantined]++
				if f := r.cfg.OnDecisionFunc; f != nil {
					f(DecisionQuarantined)
				}
			case errors.Is(qerr, errSkipped):
				p.Skipped++
			case ctx.Err() != nil:
				return wrote, ctx.Err()
			case pgdb.Transient(qerr):
				p.Retried++
				r.transientError(ctx, c, "quarantining the claim failed transiently; it is left for the next pass", qerr)
			default:
				r.log.ErrorContext(ctx, "quarantining failed", slog.String("session_id", c.SessionID), slog.Any("error", qerr))
			}
		default:
			wrote = true
			if failed {
				p.Failed++
			}
			p.Decisions[decision]++
			if f := r.cfg.OnDecisionFunc; f != nil {
				f(decision)
			}
		}
	}
	return wrote, nil
}

// madeUnknown lists the attempts that carrying out d marks unknown: every
// attempt in flight or deferred of a reconciled execution (reconcile), or
// the started attempt sent again with its key. ev was read under the
// session's lock, after the lease expired: no executor writes them since.
func madeUnknown(d Decision, ev Evidence) []AttemptFact {
	var out []AttemptFact
	for _, a := range ev.Attempts {
		switch {
		case d.Decision == DecisionReconciled && (a.State == ledger.AttemptStarted || a.State == ledger.AttemptRetryWait):
		case d.Decision == DecisionContinued && !d.retryDeferred && a.ID == d.RetryAttemptID && a.State == ledger.AttemptStarted:
		default:
			continue
		}
		out = append(out, a)
	}
	return out
}

// reportQuarantined reads and reports the quarantined rows and the
// attempts at risk; a failure of one read does not hold back the other.
func (r *Recoverer) reportQuarantined(ctx context.Context) error {
	var errs []error
	if f := r.cfg.OnQuarantinedFunc; f != nil {
		if counts, err := QuarantinedCounts(ctx, r.pool); err != nil {
			errs = append(errs, err)
		} else {
			f(counts)
		}
	}
	if f := r.cfg.OnAtRiskFunc; f != nil {
		if atRisk, err := ledger.AttemptsAtRisk(ctx, r.pool); err != nil {
			errs = append(errs, err)
		} else {
			f(atRisk)
		}
	}
	return errors.Join(errs...)
}

func (r *Recoverer) transientError(ctx context.Context, c ledger.Claim, msg string, err error) {
	r.log.WarnContext(ctx, msg, slog.String("session_id", c.SessionID), slog.String("execution_id", c.ExecutionID), slog.Any("error", err))
	if f := r.cfg.OnTransientErrorFunc; f != nil {
		f()
	}
}

var errSkipped = errors.New("claim changed or taken over by another process")

func (r *Recoverer) expired(ctx context.Context) ([]ledger.Claim, error) {
	return scanExpired(ctx, r.pool, r.cfg.Batch, "", nil)
}

// recover decides for one expired claim in one transaction: it gathers
// the evidence, decides on it (Decide, the function the plan applies) and
// applies the decision. failed says that the decision quarantined the claim
// because it could not be carried out (a continuation ID held elsewhere),
// not because the row failed validation.
func (r *Recoverer) recover(ctx context.Context, old ledger.Claim) (DecisionKind, bool, error) {
	return r.recoverOnly(ctx, old, "")
}

// recoverPaced is recover that, when the decision needs a token and the
// bucket has none, waits (the decision rolled back: no lock is held) and
// tries again, until deadline; then it returns errDeferred.
func (r *Recoverer) recoverPaced(ctx context.Context, old ledger.Claim, deadline time.Time) (DecisionKind, bool, error) {
	for {
		decision, failed, err := r.recover(ctx, old)
		var nt *noTokenError
		if !errors.As(err, &nt) {
			return decision, failed, err
		}
		if time.Now().Add(nt.After).After(deadline) {
			return "", false, errDeferred
		}
		if err := waitCtx(ctx, nt.After); err != nil {
			return "", false, err
		}
	}
}

// recoverOnly is recover that, when want is not empty, carries out the
// decision only if it is want (an operator's apply --decision), and else
// rolls back having written nothing (errSkipped).
func (r *Recoverer) recoverOnly(ctx context.Context, old ledger.Claim, want DecisionKind) (DecisionKind, bool, error) {
	var d Decision
	var ev Evidence
	err := pgdb.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		// The session row first (invariant 7): admission serialises on it,
		// so the waiting inputs counted below cannot grow before commit;
		// an input admitted after that commit finds no claim and its own
		// wake runs it.
		if _, _, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: old.SessionID}); err != nil {
			return fmt.Errorf("locking session: %w", err)
		}
		var err error
		ev, err = r.gather(ctx, tx, old)
		if err != nil {
			return err
		}
		d = Decide(old, ev, r.cfg.IdempotentProviders)
		if want != "" && d.Decision != want {
			return errSkipped
		}
		return r.apply(ctx, tx, old, ev, d)
	})
	if err != nil {
		return "", false, err
	}
	if f := r.cfg.OnAttemptUnknownFunc; f != nil {
		for _, a := range madeUnknown(d, ev) {
			f(a.Provider, a.Model)
		}
	}
	if d.Decision == DecisionQuarantined {
		r.log.WarnContext(ctx, "claim quarantined", slog.String("session_id", old.SessionID),
			slog.String("execution_id", old.ExecutionID), slog.String("reason", d.QuarantineReason))
		if d.capped {
			if f := r.cfg.OnCappedFunc; f != nil {
				f()
			}
		}
		return DecisionQuarantined, d.failed, nil
	}
	r.log.InfoContext(ctx, "recovery decided", slog.String("session_id", old.SessionID),
		slog.String("execution_id", old.ExecutionID), slog.String("phase", string(old.Phase)), slog.String("decision", string(d.Decision)))
	return d.Decision, false, nil
}

// The defaults of Config, exported so that the consumer's flags state
// them once.
const (
	IntervalDefault            = 10 * time.Second
	BatchDefault               = 100
	RedriveAfterDefault        = 30 * time.Second
	MaxPerSessionWindowDefault = time.Hour
)
