package recovery

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
)

// Decisions.
const (
	DecisionCleared     = "cleared"
	DecisionSuperseded  = "superseded"
	DecisionRewoken     = "rewoken"
	DecisionContinued   = "continued"
	DecisionReconciled  = "reconciled"
	DecisionQuarantined = "quarantined"
)

// Rules: exceptions to "never replay an uncertain call".
const (
	RuleIdempotentToolRetry     = "idempotent_tool_retry"
	RuleIdempotentProviderRetry = "idempotent_provider_retry"
)

// ContinuationID is the deterministic continuation input of an execution.
var ContinuationID = ledger.ContinuationID

// ContinuationTakenID is the continuation input's ID when a prompt holds
// ContinuationID: "recovery-continue <execution ID>", which no prompt can
// hold (a prompt's message ID has no space, envelope.Decode).
func ContinuationTakenID(executionID string) string { return "recovery-continue " + executionID }

// OutcomeUnknownText marks an assistant message reconciled after a restart.
const OutcomeUnknownText = "outcome unknown after restart"

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
	// Topics names the outbox targets. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// IdempotentProviders names the providers (as recorded on attempts)
	// that honour idempotency keys. Defaults to none.
	IdempotentProviders []string
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnDecisionFunc counts decisions (metrics). Defaults to nothing.
	OnDecisionFunc func(decision string)
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
	OnHeldFunc func(counts map[string]int)
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
	cfg.Interval = cmp.Or(cfg.Interval, 10*time.Second)
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.RedriveAfter = cmp.Or(cfg.RedriveAfter, 30*time.Second)
	cfg.OwnerID = cmp.Or(cfg.OwnerID, "recovery")
	cfg.Mode = cmp.Or(cfg.Mode, ModeAuto)
	cfg.HeldPages = cmp.Or(cfg.HeldPages, 10)
	cfg.MaxPerSessionWindow = cmp.Or(cfg.MaxPerSessionWindow, time.Hour)
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
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
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
type Pass struct {
	Decisions map[string]int
	Skipped   int // taken over by another process first
	Failed    int // decision failed deterministically; the row was quarantined
	Retried   int // decision failed transiently; the row is left for the next pass
	Redriven  int
	// Deferred counts the claims and lost wakes left for the next pass
	// for want of a recovery token (Config.Rate).
	Deferred int `json:",omitempty"`
	// Held is what a pass in hold planned and left, by decision (lost
	// wakes as DecisionRedriven); empty in auto.
	Held map[string]int `json:",omitempty"`
}

// RunOnce runs one bounded pass: expired claims, then lost wakes.
func (r *Recoverer) RunOnce(ctx context.Context) (Pass, error) {
	p := Pass{Decisions: map[string]int{}}
	mode, err := r.mode(ctx)
	if err != nil {
		return p, err
	}
	if mode == ModeHold {
		// Held: plan only, take nothing over, wake nothing; an operator
		// applies (Apply) or resumes.
		if p.Held, err = r.held(ctx); err != nil {
			return p, err
		}
		r.log.DebugContext(ctx, "recovery pass held", slog.Any("held", p.Held))
		if f := r.cfg.OnHeldFunc; f != nil {
			f(p.Held)
		}
		return p, r.reportQuarantined(ctx)
	}
	r.forgetHeld()
	if f := r.cfg.OnHeldFunc; f != nil {
		f(map[string]int{})
	}
	// The pass waits for recovery tokens at most one interval: what it
	// cannot decide by then is the next pass's.
	deadline := time.Now().Add(r.cfg.Interval)
	if r.cfg.Rate > 0 {
		if _, err := r.pool.Exec(ctx, ensureBucketSQL); err != nil {
			return p, fmt.Errorf("checking the recovery bucket: %w", err)
		}
	}
	claims, err := r.expired(ctx)
	if err != nil {
		return p, err
	}
	wrote := false
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
				return p, ctx.Err()
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
				return p, ctx.Err()
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
	n, deferred, err := r.redrivePaced(ctx, deadline)
	if err != nil {
		return p, err
	}
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
	return p, r.reportQuarantined(ctx)
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

// Evidence is what a decision rested on, stored with it.
type Evidence struct {
	Phase              string          `json:"phase"`
	AssistantMessageID string          `json:"assistant_message_id,omitempty"`
	AssistantStatus    string          `json:"assistant_status,omitempty"`
	NewestAssistantID  string          `json:"newest_assistant_message_id,omitempty"`
	TurnID             string          `json:"turn_id,omitempty"`
	TurnMessageIDs     []string        `json:"turn_message_ids,omitempty"`
	Attempts           []AttemptFact   `json:"attempts"`
	ToolCalls          []ToolCallFact  `json:"tool_calls"`
	WaitingInputs      int             `json:"waiting_inputs"`
	Owner              string          `json:"owner"`
	ExpiredAt          time.Time       `json:"expired_at"`
	Extra              json.RawMessage `json:"extra,omitempty"`
	// ContinuationHolders are the inputs that hold the candidate IDs of
	// the execution's continuation (Decide picks one); not stored.
	ContinuationHolders []InputFact `json:"-"`
	// Cap is the session's count against Config.MaxPerSession; nil when
	// no cap is set.
	Cap *CapFact `json:"recovery_cap,omitempty"`
}

// ReasonRecoveryCap begins the quarantine reason of a claim whose session
// reached Config.MaxPerSession.
const ReasonRecoveryCap = "recovery_cap"

// CapFact is how often a session's turns were run again by recovery.
type CapFact struct {
	// Max and Window are the cap (Config.MaxPerSession in
	// Config.MaxPerSessionWindow).
	Max    int    `json:"max"`
	Window string `json:"window"`
	// Recovered counts the session's recoveries that ran its turn again
	// (continued, rewoken) within the window, after the last release of a
	// claim of the session quarantined by the cap (ReleasedAt).
	Recovered  int        `json:"recovered"`
	ReleasedAt *time.Time `json:"released_at,omitempty"`
}

// reached says that one more recovery that runs the turn again exceeds
// the cap.
func (c *CapFact) reached() bool { return c != nil && c.Max > 0 && c.Recovered >= c.Max }

// gather reads the evidence of a decision, with the session's count
// against the cap when one is set.
func (r *Recoverer) gather(ctx context.Context, tx pgx.Tx, c ledger.Claim) (Evidence, error) {
	ev, err := gather(ctx, tx, c)
	if err != nil || r.cfg.MaxPerSession <= 0 {
		return ev, err
	}
	ev.Cap = &CapFact{Max: r.cfg.MaxPerSession, Window: r.cfg.MaxPerSessionWindow.String()}
	// A release of a capped claim starts the count afresh: the operator
	// has looked, and the session runs again (up to the cap) before it is
	// capped again.
	err = tx.QueryRow(ctx, `SELECT (SELECT max(released_at) FROM quarantine_releases
		WHERE kind = $2 AND ref = $1 AND starts_with(reason, $3))`, c.SessionID, KindClaim, ReasonRecoveryCap+":").Scan(&ev.Cap.ReleasedAt)
	if err != nil {
		return ev, fmt.Errorf("reading the last release of a capped claim: %w", err)
	}
	// Only recoveries since the session last made progress count: a step
	// answered, or a turn ended, after a recovery proves it was not a loop
	// (a turn that crashes its process each time it runs answers nothing).
	// Counted without it, five lease expiries of a healthy session within
	// the window (a database stall, a paused process, a fleet-wide crash)
	// would quarantine it, a transient fault quarantining a valid row
	// (docs/design.md, invariant 13).
	err = tx.QueryRow(ctx, `SELECT count(*) FROM recoveries
		WHERE session_id = $1 AND decision = ANY($2) AND decided_at > now() - $3 * interval '1 millisecond'
		  AND ($4::timestamptz IS NULL OR decided_at > $4)
		  AND decided_at > coalesce((SELECT max(completed_at) FROM messages
		      WHERE session_id = $1 AND role = 'assistant' AND status IN ('completed', 'errored')), '-infinity')`,
		c.SessionID, []string{DecisionContinued, DecisionRewoken}, r.cfg.MaxPerSessionWindow.Milliseconds(), ev.Cap.ReleasedAt).Scan(&ev.Cap.Recovered)
	if err != nil {
		return ev, fmt.Errorf("counting the session's recoveries: %w", err)
	}
	return ev, nil
}

// InputFact is an input holding a continuation's candidate ID.
type InputFact struct {
	MessageID   string
	SessionID   string
	Kind        string
	PayloadHash []byte
}

// AttemptFact is a provider attempt as recovery found it.
type AttemptFact struct {
	ID       string              `json:"id"`
	Step     int                 `json:"step"`
	Provider string              `json:"provider"`
	State    ledger.AttemptState `json:"state"`
	// What was known of the attempt, as early as it was known: the model,
	// the estimated input tokens of its request, and the provider's
	// response or request ID (empty when none arrived before the crash).
	Model         string `json:"model,omitempty"`
	RequestTokens int64  `json:"request_tokens,omitempty"`
	ResponseID    string `json:"response_id,omitempty"`
}

// ToolCallFact is a tool call as recovery found it.
type ToolCallFact struct {
	ID        string           `json:"id"`
	AttemptID string           `json:"attempt_id"`
	Tool      string           `json:"tool"`
	Class     string           `json:"class"`
	State     ledger.CallState `json:"state"`
}

// recover decides for one expired claim in one transaction: it gathers
// the evidence, decides on it (Decide, the function the plan applies) and
// applies the decision. failed says that the decision quarantined the claim
// because it could not be carried out (a continuation ID held elsewhere),
// not because the row failed validation.
func (r *Recoverer) recover(ctx context.Context, old ledger.Claim) (string, bool, error) {
	return r.recoverOnly(ctx, old, "")
}

// recoverPaced is recover that, when the decision needs a token and the
// bucket has none, waits (the decision rolled back: no lock is held) and
// tries again, until deadline; then it returns errDeferred.
func (r *Recoverer) recoverPaced(ctx context.Context, old ledger.Claim, deadline time.Time) (string, bool, error) {
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
func (r *Recoverer) recoverOnly(ctx context.Context, old ledger.Claim, want string) (string, bool, error) {
	var d Decision
	var ev Evidence
	err := pgdb.InTx(ctx, r.pool, func(tx pgx.Tx) error {
		// The session row first (invariant 7): admission serialises on it,
		// so the waiting inputs counted below cannot grow before commit;
		// an input admitted after that commit finds no claim and its own
		// wake runs it.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE`, old.SessionID); err != nil {
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
		slog.String("execution_id", old.ExecutionID), slog.String("phase", string(old.Phase)), slog.String("decision", d.Decision))
	return d.Decision, false, nil
}

// apply carries out a decision taken on ev, in the transaction that
// gathered ev under the session's lock: the takeover (compare-and-swap),
// the decision's writes, its record and its outbox rows commit together
// (invariant 9). It writes nothing that Decide did not name, except that
// the continuation moves to its other ID when a prompt of another session
// took the chosen one since ev was read (admitContinuation).
func (r *Recoverer) apply(ctx context.Context, tx pgx.Tx, old ledger.Claim, ev Evidence, d Decision) error {
	if d.Decision == DecisionQuarantined {
		return r.quarantineTx(ctx, tx, old, d.QuarantineReason, &ev)
	}
	nc, err := ledger.Takeover(ctx, tx, old, "recovery/"+old.ExecutionID, r.cfg.OwnerID, time.Minute)
	if errors.Is(err, ledger.ErrNotExpired) {
		return errSkipped
	}
	if err != nil {
		return err
	}
	faults.Hit(faults.RecoveryAfterTakeover)
	if err := r.carryOut(ctx, tx, old, nc, ev, &d); err != nil {
		return err
	}
	var at *time.Time
	if r.cfg.Rate > 0 && paced(ev, d) {
		// Late in the transaction, so that the bucket's row is held for
		// the record and the commit only; a rollback from here on (a
		// crash, a failed insert) returns the token.
		t, err := r.takeTokens(ctx, tx, 1)
		if err != nil {
			return err
		}
		if t.got == 0 {
			return &noTokenError{After: t.after}
		}
		faults.Hit(faults.RecoveryAfterToken)
		at = &t.at
	}
	return r.record(ctx, tx, old, nc, ev, d, at)
}

func gather(ctx context.Context, tx pgx.Tx, c ledger.Claim) (Evidence, error) {
	ev := Evidence{Phase: string(c.Phase), AssistantMessageID: c.AssistantMessageID, Owner: c.OwnerID, ExpiredAt: c.ExpiresAt,
		Attempts: []AttemptFact{}, ToolCalls: []ToolCallFact{}}
	if c.AssistantMessageID != "" {
		var turnID *string
		err := tx.QueryRow(ctx, `SELECT status, coalesce(answers, '{}'), turn_id FROM messages WHERE message_id = $1 AND session_id = $2 AND role = 'assistant'`,
			c.AssistantMessageID, c.SessionID).Scan(&ev.AssistantStatus, &ev.TurnMessageIDs, &turnID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return ev, fmt.Errorf("reading assistant message: %w", err)
		}
		if turnID != nil {
			ev.TurnID = *turnID
		}
	}
	err := tx.QueryRow(ctx, `SELECT coalesce((SELECT message_id FROM messages WHERE session_id = $1 AND role = 'assistant' ORDER BY seq DESC LIMIT 1), '')`,
		c.SessionID).Scan(&ev.NewestAssistantID)
	if err != nil {
		return ev, fmt.Errorf("reading newest assistant message: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT attempt_id, step, provider, state, coalesce(model, ''), coalesce(request_tokens, 0), coalesce(response_id, '')
		FROM attempts WHERE execution_id = $1 ORDER BY step`, c.ExecutionID)
	if err != nil {
		return ev, fmt.Errorf("reading attempts: %w", err)
	}
	if ev.Attempts, err = pgx.AppendRows(ev.Attempts, rows, pgx.RowToStructByPos[AttemptFact]); err != nil {
		return ev, fmt.Errorf("reading attempts: %w", err)
	}
	// Calls of the execution, and calls it took over from an earlier one
	// (a continuation runs the requested calls of the execution it continues).
	rows, err = tx.Query(ctx, `SELECT call_id, attempt_id, tool, class, state FROM tool_calls
		WHERE session_id = $1 AND state IN ('requested', 'started') ORDER BY requested_at, call_id`, c.SessionID)
	if err != nil {
		return ev, fmt.Errorf("reading tool calls: %w", err)
	}
	if ev.ToolCalls, err = pgx.AppendRows(ev.ToolCalls, rows, pgx.RowToStructByPos[ToolCallFact]); err != nil {
		return ev, fmt.Errorf("reading tool calls: %w", err)
	}
	err = tx.QueryRow(ctx, `SELECT count(*) FROM waiting_inputs WHERE session_id = $1`,
		c.SessionID).Scan(&ev.WaitingInputs)
	if err != nil {
		return ev, fmt.Errorf("counting waiting inputs: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT message_id, session_id, kind, payload_hash FROM inputs WHERE message_id = ANY($1) ORDER BY message_id`,
		[]string{ContinuationID(c.ExecutionID), ContinuationTakenID(c.ExecutionID)})
	if err != nil {
		return ev, fmt.Errorf("reading continuation inputs: %w", err)
	}
	if ev.ContinuationHolders, err = pgx.AppendRows(ev.ContinuationHolders, rows, pgx.RowToStructByPos[InputFact]); err != nil {
		return ev, fmt.Errorf("reading continuation inputs: %w", err)
	}
	return ev, nil
}

// validate returns why a claim cannot be decided on, or "".
func validate(c ledger.Claim, ev Evidence) string {
	switch c.Phase {
	case ledger.PhaseReady, ledger.PhaseUnknown, ledger.PhaseContinue, ledger.PhaseSafe:
	default:
		return fmt.Sprintf("unknown phase %q", c.Phase)
	}
	if c.AssistantMessageID != "" && ev.AssistantStatus == "" {
		return fmt.Sprintf("claim points at missing assistant message %s", c.AssistantMessageID)
	}
	if c.Phase == ledger.PhaseContinue && c.AssistantMessageID == "" {
		return "phase continue without an assistant message"
	}
	return ""
}

// Decision is what recovery decides for one expired claim: a pure function
// of the claim and its evidence (Decide), so that a plan (Plan) and a pass
// take the same decision on the same evidence.
type Decision struct {
	Decision string `json:"decision"`
	Rule     string `json:"rule,omitempty"`
	// ContinuationID is the continuation input a continued decision admits.
	ContinuationID string `json:"continuation_message_id,omitempty"`
	// RetryAttemptID is the attempt sent again with its idempotency key.
	RetryAttemptID   string `json:"retry_attempt_id,omitempty"`
	QuarantineReason string `json:"quarantine_reason,omitempty"`

	retryDeferred bool // RetryAttemptID was deferred (retry_wait), not started
	failed        bool // quarantined because the decision cannot be carried out
	capped        bool // quarantined because the session reached its cap (ev.Cap)
}

// Decide decides for an expired claim on its evidence, reading and writing
// nothing: idempotentProviders name the providers that honour idempotency
// keys (Config.IdempotentProviders).
func Decide(old ledger.Claim, ev Evidence, idempotentProviders []string) Decision {
	if reason := validate(old, ev); reason != "" {
		return Decision{Decision: DecisionQuarantined, QuarantineReason: reason}
	}
	d := Decision{}
	superseded := old.AssistantMessageID != "" && ev.NewestAssistantID != old.AssistantMessageID
	switch {
	case superseded:
		d.Decision = DecisionSuperseded
	case old.Phase == ledger.PhaseSafe:
		d.Decision = DecisionCleared
	case old.Phase == ledger.PhaseReady:
		d.Decision = DecisionRewoken
	case old.Phase == ledger.PhaseContinue:
		d.Decision = DecisionContinued
		d.Rule, d.RetryAttemptID, d.retryDeferred = continueRule(ev, idempotentProviders)
	case old.Phase == ledger.PhaseUnknown:
		d.Decision, d.Rule, d.RetryAttemptID = unknownRule(ev, idempotentProviders)
	}
	if d.Decision == DecisionContinued {
		id, reason := continuationID(old, ev)
		if reason != "" {
			// The decision cannot be carried out: a failed decision,
			// quarantined (invariant 10), as before it was decided here.
			return Decision{Decision: DecisionQuarantined, QuarantineReason: "decision failed: " + reason, failed: true}
		}
		d.ContinuationID = id
	}
	if (d.Decision == DecisionContinued || d.Decision == DecisionRewoken) && ev.Cap.reached() {
		// It would run the turn again: once too often (Config.MaxPerSession).
		return Decision{Decision: DecisionQuarantined, capped: true, QuarantineReason: fmt.Sprintf(
			"%s: the session's turns were run again by recovery %d times within %s (cap %d); this %s is not carried out",
			ReasonRecoveryCap, ev.Cap.Recovered, ev.Cap.Window, ev.Cap.Max, d.Decision)}
	}
	return d
}

// continuationHash is the payload hash of an execution's continuation input.
func continuationHash(old ledger.Claim) []byte {
	h := sha256.Sum256([]byte("continuation:" + old.SessionID + ":" + old.ExecutionID))
	return h[:]
}

// continuationID picks the continuation input's ID from the inputs that
// hold its candidates: ContinuationID, or ContinuationTakenID when a prompt
// holds that one (a message ID is the sender's to choose; what an input is
// says its kind, docs/design.md, invariant 14). An ID held by this very
// continuation is taken again (an exact retry); one held by an input of
// another session, kind or payload never is. reason says why none fits.
func continuationID(old ledger.Claim, ev Evidence) (id, reason string) {
	h := continuationHash(old)
	for _, id := range []string{ContinuationID(old.ExecutionID), ContinuationTakenID(old.ExecutionID)} {
		i := slices.IndexFunc(ev.ContinuationHolders, func(in InputFact) bool { return in.MessageID == id })
		if i < 0 {
			return id, ""
		}
		in := ev.ContinuationHolders[i]
		if in.Kind == "continuation" && in.SessionID == old.SessionID && bytes.Equal(in.PayloadHash, h) {
			return id, ""
		}
		if in.Kind == "continuation" && in.SessionID != old.SessionID {
			return "", fmt.Sprintf("continuation input %s belongs to session %s, not %s", id, in.SessionID, old.SessionID)
		}
	}
	return "", fmt.Sprintf("continuation input of %s: both IDs are held by other inputs", old.ExecutionID)
}

// carryOut writes what the decision d names, after the takeover;
// d.ContinuationID becomes the continuation's ID as admitted.
func (r *Recoverer) carryOut(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence, d *Decision) error {
	if d.Decision == DecisionContinued {
		if d.Rule == RuleIdempotentToolRetry {
			// Started idempotent calls run again, with their keys.
			if _, err := tx.Exec(ctx, `UPDATE tool_calls SET state = 'requested', started_at = NULL
				WHERE session_id = $1 AND state = 'started' AND class = 'idempotent'`, old.SessionID); err != nil {
				return fmt.Errorf("re-arming idempotent tool calls: %w", err)
			}
		}
		if d.RetryAttemptID != "" && d.retryDeferred {
			// It was answered (a failure) and waited for its retry: the
			// continuation sends that retry, under the same key.
			if _, err := tx.Exec(ctx, `UPDATE attempts SET state = 'failed', error = coalesce(error, '') || '; sent again with the same idempotency key by recovery', finished_at = now()
				WHERE attempt_id = $1 AND state = 'retry_wait'`, d.RetryAttemptID); err != nil {
				return fmt.Errorf("settling deferred attempt %s: %w", d.RetryAttemptID, err)
			}
		} else if d.RetryAttemptID != "" {
			if err := ledger.FinishAttempt(ctx, tx, d.RetryAttemptID, ledger.AttemptUnknown, OutcomeUnknownText+"; sent again with the same idempotency key", 0, 0); err != nil {
				return err
			}
		}
		// An attempt deferred (certainly not sent) is settled: the
		// continuation sends its step afresh.
		if _, err := tx.Exec(ctx, `UPDATE attempts SET state = 'failed', error = coalesce(error, '') || '; not sent: continued by recovery', finished_at = now()
			WHERE execution_id = $1 AND state = 'retry_wait'`, old.ExecutionID); err != nil {
			return fmt.Errorf("settling deferred attempts: %w", err)
		}
		id, err := r.admitContinuation(ctx, tx, old, ev, d.ContinuationID)
		if err != nil {
			return err
		}
		d.ContinuationID = id
	}
	if d.Decision == DecisionReconciled {
		if err := r.reconcile(ctx, tx, old, nc, ev); err != nil {
			return err
		}
	}
	// Every decision clears the claim; invariant 7: with a wake when
	// inputs wait (a continuation input always waits).
	if _, err := tx.Exec(ctx, `DELETE FROM claims WHERE session_id = $1 AND fencing_token = $2`, nc.SessionID, nc.Token); err != nil {
		return fmt.Errorf("clearing claim: %w", err)
	}
	return nil
}

// continueRule decides for phase continue: an attempt deferred for a
// retry to a provider that honours idempotency keys is sent again with its
// key. Its failure may have been an answer after acting on the step (a
// 500, with such a provider, is retried): a fresh key would let the
// provider act twice. Other deferred attempts were certainly not acted on
// (ErrNotSent, a 429 or 503 refusal) and are sent afresh.
func continueRule(ev Evidence, idempotentProviders []string) (rule, attemptID string, deferred bool) {
	for _, a := range ev.Attempts {
		if a.State == ledger.AttemptRetryWait && slices.Contains(idempotentProviders, a.Provider) {
			return RuleIdempotentProviderRetry, a.ID, true
		}
	}
	return "", "", false
}

// unknownRule decides for phase unknown: reconcile, unless the only
// uncertain thing may be repeated with its idempotency key.
func unknownRule(ev Evidence, idempotentProviders []string) (string, string, string) {
	var startedAttempts []AttemptFact
	for _, a := range ev.Attempts {
		if a.State == ledger.AttemptStarted {
			startedAttempts = append(startedAttempts, a)
		}
	}
	var startedIdem, startedSide int
	for _, c := range ev.ToolCalls {
		if c.State == ledger.CallStarted {
			if c.Class == "idempotent" {
				startedIdem++
			} else {
				startedSide++
			}
		}
	}
	switch {
	case startedSide > 0:
	case len(startedAttempts) == 1 && startedIdem == 0 && slices.Contains(idempotentProviders, startedAttempts[0].Provider):
		return DecisionContinued, RuleIdempotentProviderRetry, startedAttempts[0].ID
	case len(startedAttempts) == 0 && startedIdem > 0:
		return DecisionContinued, RuleIdempotentToolRetry, ""
	}
	return DecisionReconciled, "", ""
}

// reconcile marks what is uncertain, never replays it: started attempts
// and calls unknown, calls never dispatched interrupted (each call's
// tool.completed says so), the assistant message errored; the turn fails
// with reason outcome_unknown. nc is the takeover claim, whose fencing
// token names the outcomes it commits (as the executor's do).
func (r *Recoverer) reconcile(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence) error {
	if _, err := tx.Exec(ctx, `UPDATE attempts SET state = 'unknown', error = $2, finished_at = now()
		WHERE execution_id = $1 AND state IN ('started', 'retry_wait')`, old.ExecutionID, OutcomeUnknownText); err != nil {
		return fmt.Errorf("reconciling attempts: %w", err)
	}
	// Each call's outcome is announced (tool.completed), in the order the
	// calls were requested, before the turn's end.
	rows, err := tx.Query(ctx, `WITH settled AS (
			UPDATE tool_calls SET state = CASE state WHEN 'started' THEN 'unknown' ELSE 'interrupted' END,
			output = CASE state WHEN 'started' THEN $2 ELSE 'interrupted: never dispatched' END, is_error = true, finished_at = now()
			WHERE session_id = $1 AND state IN ('requested', 'started')
			RETURNING call_id, model_call_id, tool, class, state, requested_at, attempt_id, idx)
		SELECT call_id, model_call_id, tool, class, state FROM settled ORDER BY requested_at, attempt_id, idx`,
		old.SessionID, OutcomeUnknownText)
	if err != nil {
		return fmt.Errorf("reconciling tool calls: %w", err)
	}
	var events []outbox.Row
	var e envelope.Event
	if _, err := pgx.ForEachRow(rows, []any{&e.CallID, &e.ModelCallID, &e.Tool, &e.Class, &e.Outcome}, func() error {
		e.ID = "tool.completed:" + e.CallID + "@" + strconv.FormatInt(nc.Token, 10)
		e.Type, e.SessionID, e.At = envelope.EventToolCompleted, old.SessionID, time.Now().UTC()
		e.TurnID = cmp.Or(ev.TurnID, old.AssistantMessageID)
		events = append(events, outbox.EventRow(r.cfg.Topics.Events, e))
		return nil
	}); err != nil {
		return fmt.Errorf("reconciling tool calls: %w", err)
	}
	if old.AssistantMessageID == "" {
		return outbox.Insert(ctx, tx, events...)
	}
	if _, err := tx.Exec(ctx, `UPDATE messages SET status = 'errored', error = $2, completed_at = now()
		WHERE message_id = $1 AND status = 'pending'`, old.AssistantMessageID, OutcomeUnknownText); err != nil {
		return fmt.Errorf("reconciling assistant message: %w", err)
	}
	failed, err := r.failedMessage(ctx, tx, old, nc, ev)
	if err != nil {
		return err
	}
	return outbox.Insert(ctx, tx, append(events, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
		ID: "turn.failed:" + failed, Type: envelope.EventTurnFailed, SessionID: old.SessionID,
		At: time.Now().UTC(), MessageIDs: ev.TurnMessageIDs, AssistantMessageID: failed,
		Reason: envelope.FailOutcomeUnknown, Error: OutcomeUnknownText,
	}))...)
}

// FailedMessageID is the assistant message recovery creates for a turn it
// reconciles when the claim's own message was named by an earlier
// failure. The space keeps it out of reach of senders: no envelope
// message ID has one (envelope.validID).
func FailedMessageID(executionID string) string { return "recovery-failed " + executionID }

// failedMessage is the assistant message the reconciled turn's turn.failed
// names: the claim's, unless an earlier reconcile named that one already.
// That happens when a continuation (recovery's or an operator's
// resolution) dies before it began a step of its own, while re-running the
// calls its turn left: its claim still points at the message the first
// failure named. The second failure then gets an errored message of its
// own, as the executor creates one for a turn that fails before its step
// began, so that its turn.failed is a new event (consumers deduplicate on
// id) and names a message the transcript holds, errored (invariant 12).
func (r *Recoverer) failedMessage(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence) (string, error) {
	var named bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM recoveries
		WHERE session_id = $1 AND execution_id <> $2 AND decision = $3 AND evidence->>'assistant_message_id' = $4)`,
		old.SessionID, old.ExecutionID, DecisionReconciled, old.AssistantMessageID).Scan(&named); err != nil {
		return "", fmt.Errorf("reading earlier failures of %s: %w", old.AssistantMessageID, err)
	}
	if !named {
		return old.AssistantMessageID, nil
	}
	id := FailedMessageID(old.ExecutionID)
	if _, err := tx.Exec(ctx, `INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id, error, completed_at)
		VALUES ($1, $2, 'assistant', 'errored', $3, $4, $5, $6, $7, now())`,
		id, old.SessionID, ev.TurnMessageIDs, old.ExecutionID, nc.Token, cmp.Or(ev.TurnID, old.AssistantMessageID), OutcomeUnknownText); err != nil {
		return "", fmt.Errorf("creating the failed turn's assistant message: %w", err)
	}
	return id, nil
}

// admitContinuation admits the continuation input (Decide chose its ID
// on ev), of kind continuation: a steer, so that it runs before queued
// prompts, and returns the ID it admitted. A second admission is an exact
// retry. Inputs of other sessions are not serialised by this session's
// lock, so a prompt of another session may have come to hold the chosen ID
// since ev was read: the holder it finds joins the evidence and the ID is
// chosen again by the same rule (continuationID), as the pass chose it
// before it decided on gathered evidence; an ID held by an input of another
// session, kind or payload is never taken for this one, and when no ID
// fits, the decision fails.
func (r *Recoverer) admitContinuation(ctx context.Context, tx pgx.Tx, old ledger.Claim, ev Evidence, id string) (string, error) {
	h := continuationHash(old)
	holders := slices.Clone(ev.ContinuationHolders)
	for range 3 { // two candidate IDs: at most two holders found here
		var in InputFact
		err := tx.QueryRow(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
			VALUES ($1, $2, '', $3, 'steer', true, 'continuation')
			ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id
			RETURNING message_id, session_id, kind, payload_hash`, id, old.SessionID, h).Scan(&in.MessageID, &in.SessionID, &in.Kind, &in.PayloadHash)
		if err != nil {
			return "", fmt.Errorf("admitting continuation %s: %w", id, err)
		}
		if in.Kind == "continuation" && in.SessionID == old.SessionID && bytes.Equal(in.PayloadHash, h) {
			return id, nil
		}
		holders = append(slices.DeleteFunc(holders, func(f InputFact) bool { return f.MessageID == in.MessageID }), in)
		var reason string
		if id, reason = continuationID(old, Evidence{ContinuationHolders: holders}); reason != "" {
			return "", errors.New(reason)
		}
	}
	return "", fmt.Errorf("continuation input of %s: no ID could be admitted", old.ExecutionID)
}

// record stores the decision, decided at at (the time its token was
// taken, so that recoveries.decided_at shows the pace) or now().
func (r *Recoverer) record(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence, d Decision, at *time.Time) error {
	evJSON, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, rule, evidence,
			token_before, token_after, continuation_message_id, retry_attempt_id, recovered_by, decided_at)
		VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, nullif($9, ''), nullif($10, ''), $11, coalesce($12, now()))
		ON CONFLICT (execution_id) DO UPDATE SET phase_found = excluded.phase_found, decision = excluded.decision,
			rule = excluded.rule, evidence = excluded.evidence, token_before = excluded.token_before,
			token_after = excluded.token_after, continuation_message_id = excluded.continuation_message_id,
			retry_attempt_id = excluded.retry_attempt_id, recovered_by = excluded.recovered_by, decided_at = excluded.decided_at
		WHERE recoveries.decision = 'quarantined'`,
		old.ExecutionID, old.SessionID, string(old.Phase), d.Decision, d.Rule, evJSON, old.Token, nc.Token,
		d.ContinuationID, d.RetryAttemptID, r.cfg.OwnerID, at)
	if err != nil {
		return fmt.Errorf("recording recovery of %s: %w", old.ExecutionID, err)
	}
	if tag.RowsAffected() != 1 {
		// Only a quarantine (repaired and released since) may be followed
		// by a decision; a second decision for one execution is a bug.
		return fmt.Errorf("recording recovery of %s: it was decided before", old.ExecutionID)
	}
	rows := []outbox.Row{outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
		ID: "recovery.decided:" + old.ExecutionID, Type: envelope.EventRecoveryDecided, SessionID: old.SessionID,
		At: time.Now().UTC(), ExecutionID: old.ExecutionID, Decision: d.Decision, Rule: d.Rule,
		ContinuationMessageID: d.ContinuationID,
	})}
	if d.ContinuationID != "" && old.AssistantMessageID != "" && len(ev.TurnMessageIDs) > 0 {
		// The turn goes on: its ID, from the execution, is the same however
		// often this decision is retried (it commits once, invariant 9).
		rows = append(rows, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
			ID: "turn.recovered:" + old.ExecutionID, Type: envelope.EventTurnRecovered, SessionID: old.SessionID,
			At: time.Now().UTC(), TurnID: cmp.Or(ev.TurnID, old.AssistantMessageID), MessageIDs: ev.TurnMessageIDs,
			AssistantMessageID: old.AssistantMessageID, ExecutionID: old.ExecutionID, Rule: d.Rule,
			ContinuationMessageID: d.ContinuationID,
		}))
	}
	if wakes(ev, d) {
		rows = append(rows, outbox.WakeRow(r.cfg.Topics.Wakes, old.SessionID, "recovery", time.Now().UTC()))
	}
	return outbox.Insert(ctx, tx, rows...)
}

// quarantineClaim marks the claim in its own transaction (after a failed
// decision).
func (r *Recoverer) quarantineClaim(ctx context.Context, c ledger.Claim, reason string) error {
	return pgdb.InTx(ctx, r.pool, func(tx pgx.Tx) error { return r.quarantineTx(ctx, tx, c, reason, nil) })
}

// quarantineTx marks the claim, by compare-and-swap on the values that were
// scanned, so that later scans skip it until an operator releases it. ev,
// when not nil, is the evidence the quarantine was decided on, stored with
// it (a failed decision has none: '{}').
func (r *Recoverer) quarantineTx(ctx context.Context, tx pgx.Tx, c ledger.Claim, reason string, ev *Evidence) error {
	evJSON := []byte(`{}`)
	if ev != nil {
		var err error
		if evJSON, err = json.Marshal(ev); err != nil {
			return err
		}
	}
	tag, err := tx.Exec(ctx, `UPDATE claims SET quarantine_reason = $5, quarantined_at = now()
		WHERE session_id = $1 AND execution_id = $2 AND fencing_token = $3 AND expires_at = $4 AND quarantine_reason IS NULL`,
		c.SessionID, c.ExecutionID, c.Token, c.ExpiresAt, reason)
	if err != nil {
		return fmt.Errorf("quarantining claim of %s: %w", c.SessionID, err)
	}
	if tag.RowsAffected() == 0 {
		return errSkipped
	}
	if _, err := tx.Exec(ctx, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence,
			token_before, token_after, recovered_by, quarantine_reason)
		VALUES ($1, $2, $3, 'quarantined', $7, $4, $4, $5, $6)
		ON CONFLICT (execution_id) DO UPDATE SET quarantine_reason = excluded.quarantine_reason, evidence = excluded.evidence, decided_at = now()
		WHERE recoveries.decision = 'quarantined'`,
		c.ExecutionID, c.SessionID, string(c.Phase), c.Token, r.cfg.OwnerID, reason, evJSON); err != nil {
		return fmt.Errorf("recording quarantine of %s: %w", c.SessionID, err)
	}
	return nil
}

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
		if _, err := tx.Exec(ctx, `UPDATE sessions SET redriven_at = now() WHERE session_id = ANY($1)`, sessions); err != nil {
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

const expiredSQL = `
SELECT session_id, execution_id, owner_id, fencing_token, phase, coalesce(assistant_message_id, ''), expires_at
FROM claims WHERE quarantine_reason IS NULL AND expires_at <= now() AND ($2 = '' OR session_id = $2)
  AND ($3::timestamptz IS NULL OR (expires_at, session_id) > ($3::timestamptz, $4::text))
ORDER BY expires_at, session_id LIMIT $1`

// The filters (no claim, not redriven within the interval) apply before the
// limit: a session that cannot be redriven — a quarantined or long-running
// claim, a recent redrive — never takes a place in the batch, so however
// many there are, a lost wake behind them is found (invariant 10). The old
// waiting inputs are read through their partial index, as before
// (TestRedriveScanUsesTheRedriveIndex). The outer filters are checked again
// on the locked row (a concurrent pass may have redriven it meanwhile).
// Sessions are locked in sorted order (as admission does) and skipped when
// busy: a concurrent pass or admission is handling them.
const redriveSQL = `
SELECT s.session_id FROM sessions s
WHERE s.session_id IN (
    SELECT i.session_id FROM waiting_inputs i
    JOIN sessions r ON r.session_id = i.session_id
    WHERE i.admitted_at < now() - $1 * interval '1 millisecond'
      AND (r.redriven_at IS NULL OR r.redriven_at < now() - $1 * interval '1 millisecond')
      AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = i.session_id)
      AND ($3 = '' OR i.session_id = $3)
    GROUP BY i.session_id
    ORDER BY min(i.admitted_at), i.session_id
    LIMIT $2)
  AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = s.session_id)
  AND (s.redriven_at IS NULL OR s.redriven_at < now() - $1 * interval '1 millisecond')
ORDER BY s.session_id
FOR UPDATE SKIP LOCKED`

// redrivePlanSQL is redriveSQL's selection read without locks (a plan runs
// read only), with what the plan shows of each session; $3, when not
// empty, keeps that session only.
const redrivePlanSQL = `
SELECT i.session_id, count(*)::int, min(i.admitted_at) FROM waiting_inputs i
JOIN sessions r ON r.session_id = i.session_id
WHERE i.admitted_at < now() - $1 * interval '1 millisecond'
  AND (r.redriven_at IS NULL OR r.redriven_at < now() - $1 * interval '1 millisecond')
  AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = i.session_id)
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
WHERE i.admitted_at < now() - $1 * interval '1 millisecond'
  AND (r.redriven_at IS NULL OR r.redriven_at < now() - $1 * interval '1 millisecond')
  AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.session_id = i.session_id)
  AND ($2 = '' OR i.session_id = $2)`
