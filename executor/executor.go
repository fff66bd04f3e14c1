package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/kafkautil"
	"github.com/promptline/promptline/internal/lazylog"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/retry"
	"github.com/promptline/promptline/internal/startstop"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// ExecutorConfig configures an Executor.
type ExecutorConfig struct {
	// Claims acquires the session claims. Required.
	Claims *ledger.Claims
	// Topics names the outbox targets. Defaults to kafkautil's defaults.
	Topics kafkautil.Topics
	// Provider answers turns. Defaults to ScriptedProvider.
	Provider provider.Provider
	// ProviderName is recorded with each attempt. Defaults to "scripted".
	ProviderName string
	// Tools the model may call. Defaults to none.
	Tools *tools.Registry
	// PermissionFunc says whether a tool may run: allow, deny, or ask (the
	// session parks until a reply arrives). Defaults to allow.
	PermissionFunc func(tool string) tools.Permission
	// MaxSessions bounds the sessions executing at once; Wake blocks (and
	// so consumption pauses) while all are busy. Defaults to 256.
	MaxSessions int
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnClaimFunc runs at each claim event of a run, with the event:
	// "acquired", "released" or "lost" (the ledger's OnRenewedFunc has the
	// renewals). Defaults to nothing.
	OnClaimFunc func(event string)
	// OnWakeFunc runs for each wake handed to the executor, with its
	// result: "started" (a run begins) or "coalesced" (folded into the
	// session's run here). Defaults to nothing.
	OnWakeFunc func(result string)
	// OnRunStartedFunc runs when a session's run starts in this process,
	// OnRunEndedFunc when it ends: their difference is the sessions
	// executing here now. Defaults to nothing.
	OnRunStartedFunc, OnRunEndedFunc func()
	// OnTurnFunc runs when a turn finishes, with its outcome ("completed"
	// or "failed") and the time since its promotion. Defaults to nothing.
	OnTurnFunc func(outcome string, sincePromotion time.Duration)
	// OnAttemptFunc runs after each provider request, with the outcome the
	// process saw (OutcomeSucceeded, OutcomeFailed, or OutcomeUnknown when
	// it may have been acted on) and how long it took. Defaults to nothing.
	OnAttemptFunc func(outcome string, took time.Duration)
	// OnAttemptUnknownFunc runs each time the executor records a provider
	// attempt unknown (it may have been billed), with the provider's name
	// and model ("" when it names none), as recovery's does for those it
	// reconciles. Defaults to nothing.
	OnAttemptUnknownFunc func(provider, model string)
	// OnResponseIDWriteFailedFunc runs each time a best-effort write of a
	// provider's response ID, while its attempt was in flight, fails (the
	// turn goes on). Defaults to nothing.
	OnResponseIDWriteFailedFunc func()
	// OnToolRunFunc runs after each tool run, with its outcome
	// (OutcomeSucceeded, OutcomeFailed, OutcomeUnknown) and how long it
	// took. Defaults to nothing.
	OnToolRunFunc func(outcome string, took time.Duration)
	// OnCallSettledFunc runs when a tool call settles, with its outcome:
	// OutcomeSucceeded, OutcomeFailed (invalid and declined calls too) or
	// OutcomeUnknown. Defaults to nothing.
	OnCallSettledFunc func(outcome string)
	// OnCommitFunc runs after each commit that wrote outbox rows (the
	// relay's Nudge). Defaults to nothing.
	OnCommitFunc func()
	// ToolTimeout bounds one tool call: when it passes, the call's context
	// ends, and a tool that has not answered shortly after is abandoned;
	// the call's outcome is then unknown (never run again automatically).
	// Defaults to 30s.
	ToolTimeout time.Duration
	// Deltas takes the live text deltas of streaming providers (not
	// durable; docs/session-events.md, "Live deltas"). Defaults to none:
	// no deltas are made.
	Deltas DeltaSink
	// DeltaInterval is how long a delta's text may wait to be coalesced
	// with the text that follows it. Defaults to 50ms.
	DeltaInterval time.Duration
	// DeltaMaxBytes publishes a delta once its text has this many bytes.
	// Defaults to 1024.
	DeltaMaxBytes int
	// MaxMessageBytes is the largest message the outbox relay sends
	// (outbox.RelayConfig.MaxMessageBytes): an event whose answer, error
	// or tool input would make it larger carries what fits and says it was
	// cut (envelope.Event.Truncated); the transcript holds the whole.
	// Defaults to the relay's default.
	MaxMessageBytes int
	// StopGrace is how long Stop lets running turns finish before it
	// cancels them (they still settle and release). Defaults to 30s.
	StopGrace time.Duration
	// FairShare is how long a session's execution runs turn after turn
	// (its prompts keep arriving) before, when another session waits for
	// a slot, it hands its session back after the turn under way: released
	// with a wake, as a stopping execution is, so that the session queues
	// behind the others. Defaults to 10s.
	FairShare time.Duration
}

// Outcomes of provider attempts and tool calls, as the ledger records
// them, passed to OnAttemptFunc, OnToolRunFunc and OnCallSettledFunc (the
// outcome label of their metrics).
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	OutcomeUnknown   = "unknown"
)

// Outcomes lists the outcomes above.
var Outcomes = []string{OutcomeSucceeded, OutcomeFailed, OutcomeUnknown}

const (
	maxSessionsDefault = 256
	toolTimeoutDefault = 30 * time.Second
	fairShareDefault   = 10 * time.Second
	// StopGraceDefault is ExecutorConfig.StopGrace's default, and the
	// consumer's --shutdown-grace.
	StopGraceDefault = 30 * time.Second
)

// Executor runs sessions: for a woken session it acquires the session's
// claim, promotes the waiting inputs turn by turn, calls the provider,
// stores the answer and announces it, and releases the claim when nothing
// waits. One session never runs twice in one process: wakes for a running
// (or stopping) session fold into one successor run, which starts only
// after the current run has settled and released.
//
// Its lifecycle is the one of every background service
// (internal/startstop): Start returns at once, and wakes are taken from
// then on; Stop is the graceful stop (no new wakes, running turns get
// StopGrace to finish, then are cancelled), StopNow the hard one; both may
// be called before Start, twice and together; a stopped executor may be
// started again. A turn cancelled by a stop still settles and releases
// its claim, with a wake where input waits.
type Executor struct {
	toolSpecs          atomic.Pointer[toolSpecsCache] // execution.toolSpecs
	providerName       string
	providerModel      string
	idempotentProvider bool

	pool   *pgxpool.Pool
	claims *ledger.Claims
	cfg    ExecutorConfig
	log    *slog.Logger
	slots  chan struct{}
	// slotWaiters counts the wakes waiting in Wake for a slot; handBacks
	// the runs that took one of them as theirs to hand their session back
	// for and have not freed their slot yet, so that one waiter sends one
	// run back, not every run at a turn's end meanwhile.
	slotWaiters, handBacks atomic.Int32

	// life serialises Start and Stop: Stop holds it until every run has
	// ended, so that a Start racing with a Stop finds the executor stopped,
	// not half stopped.
	life sync.Mutex

	mu   sync.Mutex
	runs map[string]*sessionRun
	// ctx is the turns' context of the current start, cancelled when the
	// stop's grace ends (or at once by StopNow). Set under mu by Start; the
	// runs read it without mu, which is safe: Start cannot run again until
	// Stop has waited for every run of the start before.
	ctx    context.Context
	cancel context.CancelFunc
	// started is true from Start to the end of Stop; starts counts the
	// Starts, so that the hard stop of an ended Start's ctx cannot stop a
	// later one.
	started bool
	starts  uint64
	unwatch func() bool
	wg      sync.WaitGroup
	// stopping refuses new wakes: before Start, and from a stop's begin.
	stopping bool

	local localWakes

	// afterRead, when set (tests only), runs between an execution's read of
	// its session and the claim taken as read.
	afterRead func()
	// beforeRunEnds, when set (tests only), runs when a run's execution
	// has returned, before the run decides whether to go again.
	beforeRunEnds func(sessionID string)
	// beforePromote, when set (tests only), runs before a promotion's
	// transaction under a claim taken alone (replies, continuations).
	beforePromote func()
}

type sessionRun struct {
	partition int32
	again     bool          // a wake arrived while running: run once more
	stop      atomic.Bool   // partition revoked or shutting down: no new turn
	done      chan struct{} // closed when the session goes idle here
	// yielded: the execution handed its session back with a wake while
	// inputs waited (FairShare); the run ends, and that wake runs it
	// again behind the sessions waiting for a slot. Only the run's
	// goroutine reads and writes it.
	yielded bool
	// owes: the execution took a hand-back (owesSlot); given back when
	// the run's slot is free.
	owes bool
}

// NewExecutor returns a stopped Executor: Start starts it. A configuration
// it cannot run with is an error naming the field.
func NewExecutor(pool *pgxpool.Pool, config *ExecutorConfig) (*Executor, error) {
	cfg := *config
	if cfg.Claims == nil {
		return nil, errors.New("executor: ExecutorConfig.Claims is required")
	}
	cfg.Topics = cfg.Topics.WithDefaults()
	cfg.Provider = cmp.Or[provider.Provider](cfg.Provider, scripted.ScriptedProvider{})
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, maxSessionsDefault)
	cfg.ToolTimeout = cmp.Or(cfg.ToolTimeout, toolTimeoutDefault)
	cfg.DeltaInterval = cmp.Or(cfg.DeltaInterval, deltaIntervalDefault)
	cfg.DeltaMaxBytes = cmp.Or(cfg.DeltaMaxBytes, deltaMaxBytesDefault)
	if cfg.StopGrace < 0 {
		return nil, fmt.Errorf("executor: ExecutorConfig.StopGrace must not be negative, got %s", cfg.StopGrace)
	}
	cfg.StopGrace = cmp.Or(cfg.StopGrace, StopGraceDefault)
	if cfg.FairShare < 0 {
		return nil, fmt.Errorf("executor: ExecutorConfig.FairShare must not be negative, got %s", cfg.FairShare)
	}
	cfg.FairShare = cmp.Or(cfg.FairShare, fairShareDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// Until Start, the turns' context is an ended one: nothing runs.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	idem, _ := cfg.Provider.(provider.IdempotentProvider)
	var model string
	if m, ok := cfg.Provider.(provider.ModelNamer); ok {
		model = m.ModelName()
	}
	return &Executor{
		providerName: cmp.Or(cfg.ProviderName, "scripted"), providerModel: model, idempotentProvider: idem != nil && idem.HonoursIdempotencyKeys(),
		// Each execution's logger carries its session, execution and turn
		// and rarely writes: lazylog keeps those unformatted until it does.
		pool: pool, claims: cfg.Claims, cfg: cfg, log: slog.New(lazylog.Handler(cfg.Logger.Handler())),
		slots: make(chan struct{}, cfg.MaxSessions),
		runs:  map[string]*sessionRun{}, ctx: ctx, cancel: cancel, stopping: true,
	}, nil
}

// ErrStopped is returned by Wake before Start, and after a stop began.
var ErrStopped = errors.New("executor stopped")

// Start starts taking wakes and returns at once; it fails with
// startstop.ErrStarted while the executor runs. The runs' turns do not end
// with ctx: a stop ends them. When ctx ends, the executor stops hard, as
// StopNow does.
func (e *Executor) Start(ctx context.Context) error {
	e.life.Lock()
	defer e.life.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return fmt.Errorf("starting executor: %w", startstop.ErrStarted)
	}
	e.starts++
	e.ctx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	e.started, e.stopping = true, false
	n := e.starts
	e.unwatch = context.AfterFunc(ctx, func() { e.stopNow(n) })
	return nil
}

// Wake asks for the session to run; partition is the wakes partition the
// wake came from (revoking it stops the run after its current turn). It
// returns a channel closed when the session has gone idle here after
// handling everything that waited when the wake arrived. It blocks while
// MaxSessions sessions run, until ctx ends.
func (e *Executor) Wake(ctx context.Context, sessionID string, partition int32) (<-chan struct{}, error) {
	for {
		done, ok, err := e.coalesce(sessionID, partition)
		if ok || err != nil {
			return done, err
		}
		e.mu.Lock()
		turns := e.ctx
		e.mu.Unlock()
		select {
		case e.slots <- struct{}{}:
			return e.start(sessionID, partition)
		default:
		}
		// Every slot is busy: runs that have had their fair share see
		// this wake waiting and hand their sessions back (FairShare).
		e.slotWaiters.Add(1)
		select {
		case e.slots <- struct{}{}:
			e.slotWaiters.Add(-1)
			return e.start(sessionID, partition)
		case <-ctx.Done():
			e.slotWaiters.Add(-1)
			return nil, ctx.Err()
		case <-turns.Done():
			// The start this wake waited under was stopped; coalesce
			// says ErrStopped unless a later Start runs: then the wake
			// is that start's.
			e.slotWaiters.Add(-1)
		}
	}
}

// handBack marks r as handing its session back (FairShare) and takes it
// out of the runs: execute then leaves its loop for the stopping release,
// which writes a wake when inputs wait (only this claim's holder promotes
// them), queueing the session behind the others. Out of the runs first: a
// wake arriving from now on (the release's own, above all) must not join
// a run that ends, or its offset would be committed with nothing run; it
// starts a run of its own. A wake that joined before was for an input
// admitted before the release, which the release's wake covers.
//
// Its own function, kept out of execute: every execution waiting on its
// provider parks inside execute's frame, and a few more bytes there
// (this branch's log call, measured) tipped the deepest turn's stack
// past 8 KiB, doubling the stack each of ten thousand waiting executions
// keeps (docs/benchmarks.md).
//
//go:noinline
func (e *Executor) handBack(sessionID string, r *sessionRun, log *slog.Logger, started time.Time) {
	r.owes, r.yielded = true, true
	log.Debug("session handed back: another waits for a slot", slog.Duration("ran", time.Since(started)))
	e.mu.Lock()
	if e.runs[sessionID] == r {
		delete(e.runs, sessionID)
	}
	e.mu.Unlock()
}

// owesSlot says whether an execution that started at started should hand
// its session back: it has run for its fair share, and a session waits
// for a slot that no other run is handing back already. When it says
// yes, the caller owes a hand-back (sessionRun.owes) until its slot is
// free. (Between that slot freed and the waiter counting itself out, a
// second run may still hand back for the same waiter: a spare release
// and wake, never a lost one.)
func (e *Executor) owesSlot(started time.Time) bool {
	if time.Since(started) < e.cfg.FairShare {
		return false
	}
	for {
		h := e.handBacks.Load()
		if e.slotWaiters.Load() <= h {
			return false
		}
		if e.handBacks.CompareAndSwap(h, h+1) {
			return true
		}
	}
}

// WakeLocal is Wake for a wake delivered in-process right after its
// admission committed (hint.go), value being the wake's bytes as the relay
// publishes them. It never blocks: when every slot is busy it declines, and
// the wake from Kafka does the work. When it accepts, that wake, arriving
// later on partition, takes this run's completion (TakeLocal).
func (e *Executor) WakeLocal(sessionID string, partition int32, value []byte) bool {
	done, ok, err := e.coalesce(sessionID, partition)
	if err != nil {
		return false
	}
	if !ok {
		select {
		case e.slots <- struct{}{}:
		default:
			return false
		}
		if done, err = e.start(sessionID, partition); err != nil {
			return false
		}
	}
	e.local.add(value, partition, done)
	return true
}

// TakeLocal returns the completion of the local run that a wake from Kafka
// (its bytes, its partition) duplicates, if WakeLocal took it.
func (e *Executor) TakeLocal(value []byte, partition int32) (<-chan struct{}, bool) {
	return e.local.take(value, partition)
}

// start runs the session, holding a slot that it gives back if the session
// started meanwhile (the run takes the wake) or the executor is stopping.
func (e *Executor) start(sessionID string, partition int32) (<-chan struct{}, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		<-e.slots
		return nil, ErrStopped
	}
	if r, ok := e.runs[sessionID]; ok { // started while we waited for a slot
		<-e.slots
		r.join(partition)
		e.wakeMetric("coalesced")
		return r.done, nil
	}
	r := &sessionRun{partition: partition, done: make(chan struct{})}
	e.runs[sessionID] = r
	e.wg.Add(1)
	go e.run(sessionID, r)
	e.wakeMetric("started")
	return r.done, nil
}

func (e *Executor) coalesce(sessionID string, partition int32) (<-chan struct{}, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		return nil, false, ErrStopped
	}
	if r, ok := e.runs[sessionID]; ok {
		r.join(partition)
		e.wakeMetric("coalesced")
		return r.done, true, nil
	}
	return nil, false, nil
}

// join hands r a wake that arrived on partition: r runs once more before
// its session goes idle. Called under Executor.mu.
//
// A run that a revocation told to stop (Revoke) is told to go on: the wake
// comes from the partition's assignment after the revocation (Revoke runs
// once the revoked assignment's consumers have ended, and a stopping
// executor takes no wakes), so the session is this process's again. Left
// stopped, the run would end without looking at the session, and the wake
// would end with it: its input, admitted after the run's last release,
// has no other wake, and would wait for the lost-wake redrive.
func (r *sessionRun) join(partition int32) {
	r.again, r.partition = true, partition
	r.stop.Store(false)
}

func (e *Executor) claimMetric(event string) {
	if f := e.cfg.OnClaimFunc; f != nil {
		f(event)
	}
}

func (e *Executor) wakeMetric(result string) {
	if f := e.cfg.OnWakeFunc; f != nil {
		f(result)
	}
}

// Revoke is called when this process loses wakes partitions. It never
// blocks the rebalance: runs of sessions on those partitions finish their
// current turn under their claim, start no new one, and release — with a
// wake when input waits, which reaches the partition's new owner.
func (e *Executor) Revoke(partitions []int32) {
	e.local.forget(partitions)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.runs {
		if slices.Contains(partitions, r.partition) {
			r.stop.Store(true)
			r.again = false
		}
	}
}

// Stop is the graceful stop: it stops taking wakes, lets running turns
// finish for StopGrace, then cancels what remains; every run then settles
// its turn and releases its claim (with a wake where input waits). It
// returns when all runs have ended. It may be called before Start, twice,
// and together with StopNow.
func (e *Executor) Stop() { e.stop(0) }

// StopNow is the hard stop: Stop without grace, running turns cancelled at
// once (they still settle and release).
func (e *Executor) StopNow() { e.stopNow(0) }

// stopNow cancels the turns of start n (0: of the current one) and stops
// that start: a Start that comes between its cancel and its stop is a
// later start, which it leaves running.
func (e *Executor) stopNow(n uint64) {
	e.mu.Lock()
	if !e.started || (n != 0 && n != e.starts) {
		e.mu.Unlock()
		return
	}
	n = e.starts
	e.haltLocked()
	cancel, running := e.cancel, len(e.runs)
	e.mu.Unlock()
	if running > 0 {
		e.log.Warn("hard stop; cancelling running turns", slog.Int("runs", running))
	}
	cancel()
	e.stop(n)
}

// haltLocked refuses new wakes and tells every run to start no new turn.
func (e *Executor) haltLocked() {
	e.stopping = true
	for _, r := range e.runs {
		r.stop.Store(true)
		r.again = false
	}
}

// stop stops start n (0: any start), waiting StopGrace for running turns
// before it cancels them.
func (e *Executor) stop(n uint64) {
	e.life.Lock()
	defer e.life.Unlock()
	e.mu.Lock()
	if !e.started || (n != 0 && n != e.starts) {
		e.mu.Unlock()
		return
	}
	e.haltLocked()
	cancel, unwatch := e.cancel, e.unwatch
	e.mu.Unlock()
	// Start's ctx is watched until the runs have ended: if it ends during
	// the grace, the stop turns hard (its stopNow then waits here for life,
	// and finds this start stopped).
	defer unwatch()

	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	grace := time.NewTimer(e.cfg.StopGrace)
	defer grace.Stop()
	select {
	case <-done: // a StopNow meanwhile cancels the runs: they end too
	case <-grace.C:
		// Runs are still going (done has not fired), though one may be
		// leaving its map entry behind right now.
		e.mu.Lock()
		running := len(e.runs)
		e.mu.Unlock()
		e.log.Warn("shutdown grace over; cancelling running turns", slog.Int("runs", running))
	}
	cancel()
	<-done
	e.local.clear()

	e.mu.Lock()
	e.started = false
	e.mu.Unlock()
}

func (e *Executor) run(sessionID string, r *sessionRun) {
	defer e.wg.Done()
	defer func() {
		<-e.slots
		if r.owes {
			e.handBacks.Add(-1)
		}
	}()
	if f := e.cfg.OnRunStartedFunc; f != nil {
		f()
	}
	if f := e.cfg.OnRunEndedFunc; f != nil {
		defer f()
	}
	log := e.log.With(slog.String("session_id", sessionID))
	ended := false
	defer e.endedWithoutReturning(sessionID, r, log, &ended)
	for {
		e.execute(sessionID, r, log)
		if e.beforeRunEnds != nil {
			e.beforeRunEnds(sessionID)
		}
		e.mu.Lock()
		if r.again && !r.stop.Load() && !r.yielded && e.ctx.Err() == nil {
			r.again = false
			e.mu.Unlock()
			continue
		}
		if e.runs[sessionID] == r { // a run that handed its session back is out already
			delete(e.runs, sessionID)
		}
		close(r.done)
		ended = true
		e.mu.Unlock()
		return
	}
}

// endedWithoutReturning ends a run whose goroutine is ending without
// returning: a provider's Complete runs on it, and a runtime.Goexit there
// (a test double's FailNow, say) cannot be recovered. Left in the map, the
// dead run would be joined by every later wake of the session, whose done
// never closes: the session would never run again in this process. Its
// claim is left to expire, as after a crash (execute's deferred calls have
// run), and recovery decides from its phase.
func (e *Executor) endedWithoutReturning(sessionID string, r *sessionRun, log *slog.Logger, ended *bool) {
	if *ended {
		return
	}
	log.Error("the session's run ended without returning (runtime.Goexit in what it called); its claim is left to expire for recovery")
	e.mu.Lock()
	if e.runs[sessionID] == r {
		delete(e.runs, sessionID)
	}
	close(r.done)
	e.mu.Unlock()
}

// execute is one execution: acquire, run turns until nothing waits (or the
// run must stop), release.
func (e *Executor) execute(sessionID string, r *sessionRun, log *slog.Logger) {
	var released bool
	ex, first, err := e.acquire(sessionID, r, log)
	if ex == nil || err != nil {
		return
	}
	x := ex.x
	// The claim's fields, not a copy of it: this frame is on the stack of
	// every execution in flight (ledger's onPhase).
	log = log.With(slog.String("execution_id", x.ExecutionID()), slog.Int64("fencing_token", x.Token()))
	log.Debug("claim acquired")
	defer func() {
		if x.Fenced() && !released {
			e.claimMetric("lost")
		} else if released {
			e.claimMetric("released")
		}
	}()

	// Turns run on a context cancelled by a fence or by the end of the
	// shutdown grace.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	stopAfter := context.AfterFunc(x.Context(), cancel)
	defer stopAfter()
	stopKeepAlive := x.KeepAlive(ctx)
	defer func() { cancel(); stopKeepAlive() }()

	// A first turn committed with the claim is under way (its attempt's
	// intent is committed) and runs whatever happens meanwhile, as any
	// promoted turn does: a stop ends the run after it. Released instead,
	// it would be left promoted, unanswered and out of recovery's sight.
	ex.started = time.Now()
	for first != nil || (!r.stop.Load() && ctx.Err() == nil && !x.Fenced()) {
		t := first
		if first != nil {
			first = nil
		} else if e.owesSlot(ex.started) {
			e.handBack(sessionID, r, log, ex.started)
			break
		} else if t, err = ex.promote(ctx); err != nil {
			ex.logErr(ctx, log, "promoting inputs", err)
			if !x.Fenced() {
				// The promotion may have committed: an answer lost with
				// the connection, or a cancelled wait, leaves the
				// executor unable to know. Released, a promoted turn
				// would be left unanswered where no one looks again
				// (P1); left to expire, recovery decides from what did
				// commit (nothing: a re-wake; the turn's intent: a
				// reconcile), as after a crash.
				log.Warn("promotion failed; its claim is left to expire for recovery", slog.Any("error", err))
				return
			}
			break
		}
		if t == nil {
			// Nothing waits: release, unless inputs arrived meanwhile.
			if released, err = x.Release(ctx, ledger.ReleaseOpts{}); err != nil {
				ex.logErr(ctx, log, "releasing claim", err)
				break
			}
			if released {
				return
			}
			continue
		}
		if released, err = ex.runTurn(ctx, t, log); err != nil {
			ex.logErr(ctx, log, "running turn", err)
			if !errors.Is(err, errParked) && !x.Fenced() {
				// A turn cut off mid-way by an unexpected failure is left
				// as a crash would leave it: the claim expires and
				// recovery decides from its phase. Releasing it would
				// leave the turn unsettled, and no one would look again.
				log.Warn("turn failed mid-way; its claim is left to expire for recovery", slog.Any("error", err))
				return
			}
			break
		}
		if released {
			log.Debug("claim released; session idle")
			return
		}
	}
	if x.Fenced() {
		return
	}
	// Stopping (revoked, shutdown, or an error): release so that the
	// session's next owner can start, with a wake if input waits.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	released, err = x.Release(rctx, ledger.ReleaseOpts{
		Stopping: true, Wake: wakeRow(e.cfg.Topics.Wakes, sessionID, "released", time.Now().UTC()),
	})
	if err = e.announced(err); err != nil {
		ex.logErr(rctx, log, "releasing claim", err)
		return
	}
	log.Debug("claim released on stop")
}

// acquire takes the session's claim when an input waits; ex is nil when
// it does not (nothing waits, or the claim is held elsewhere).
//
// For plain prompts the claim commits together with the first turn's
// promotion and its attempt intent (phase unknown), in one transaction
// (first is that turn): the session is read first without a claim, and the
// claim is taken only if that read is still true
// (ledger.Claims.AcquireAsReadCall).
// A crash before that commit leaves nothing (the wake is redelivered: the
// prompt runs once; crash window "claim-as-read"); one after it is the
// attempt's intent window (crash window "provider-intent").
// Otherwise (continuations, permission replies, the session changed since
// the read, or the run already told to stop) the claim commits alone in
// phase ready, reading the session in the same round trip, and promotion
// follows: a crash between the two leaves a ready claim whose inputs
// recovery re-wakes, so the prompt still runs once (docs/design.md,
// crash window "claim-ready").
func (e *Executor) acquire(sessionID string, r *sessionRun, log *slog.Logger) (ex *execution, first *turn, err error) {
	view := &sessionView{}
	read, err := e.claims.Peek(e.ctx, sessionID, func(b *pgx.Batch) { view.queue(b, sessionID) })
	switch {
	case err != nil:
		return nil, nil, e.logFailure(log, "reading session", err)
	case !read.Exists:
		log.Error("acquiring claim failed", slog.String("error", "session does not exist"))
		return nil, nil, nil
	case read.Claimed:
		// The holder sees our input before it releases (admission and
		// release serialise on the session row); an expired holder is
		// recovery's.
		log.Debug("claim held elsewhere; wake dropped")
		return nil, nil, nil
	case len(view.waiting) == 0:
		return nil, nil, nil
	}
	// A run told to stop starts no turn: it claims first, and its stopping
	// release hands the session on with a wake. A transcript that cannot
	// be read starts none either: the claim, taken alone, is left to
	// recovery (promote).
	if view.plain() && !r.stop.Load() && view.unreadable == nil {
		if e.afterRead != nil {
			e.afterRead()
		}
		faults.Hit(faults.ClaimAsRead)
		ex = &execution{e: e, sessionID: sessionID}
		first, err = ex.claimFirstTurn(e.ctx, read, view)
		switch {
		case err == nil:
			e.claimMetric("acquired")
			return ex, first, nil
		case errors.Is(err, ledger.ErrStale):
			log.Debug("session changed since it was read; claiming first")
		case pgdb.Refused(err):
			// Nothing committed (retryRefused): claim first, from a
			// fresh read, as for a stale read.
			log.Warn("claim with the first turn refused by the database; claiming first", slog.Any("error", err))
		default:
			return nil, nil, e.logFailure(log, "acquiring claim", err)
		}
	}
	ex = &execution{e: e, sessionID: sessionID}
	var x *ledger.Execution
	err = retryRefused(e.ctx, log, "claim", func() error {
		view = &sessionView{}
		x, err = e.claims.AcquireWaiting(e.ctx, sessionID, newID(), func(b *pgx.Batch) { view.queue(b, sessionID) })
		return err
	})
	switch {
	case errors.Is(err, ledger.ErrNothingWaiting):
		return nil, nil, nil
	case errors.Is(err, ledger.ErrClaimHeld):
		log.Debug("claim held elsewhere; wake dropped")
		return nil, nil, nil
	case err != nil:
		return nil, nil, e.logFailure(log, "acquiring claim", err)
	}
	ex.x, ex.view = x, view
	faults.Hit(faults.ClaimAfterAcquire)
	e.claimMetric("acquired")
	return ex, nil, nil
}

// A claim the server refused (pgdb.Refused: a deadlock, a serialization
// failure, a lock not granted in time) certainly did not commit, so it is
// taken again in place, up to refusedTries times with a backoff doubled
// from refusedBackoffMin to refusedBackoffMax, each wait drawn within
// ±50% (retry.Do; docs/design.md, invariant 13). Without the retry, one
// deadlock with a concurrent writer held the session for a whole lease
// and cost a second recovery decision for one permission reply. The
// writes under a held claim (a promotion, a step's intent) are not run
// through it: the ledger retries them, refusals included, while their
// lease lives (ledger.Execution.WriteRetried), and then leaves the claim
// to expire. Wrapped in this loop as well, a write refused for good was
// begun again under a new position at each of the ledger's give-ups,
// the keep-alive keeping the fence passing: up to eight leases with the
// session out of recovery's reach
// (TestPromotionRefusedForGoodIsLeftWithinALease).
const (
	refusedTries      = 8
	refusedBackoffMin = 20 * time.Millisecond
	refusedBackoffMax = time.Second
)

// retryRefused runs try until it returns an error other than a refusal,
// refusedTries times at most; what names the write in the log.
func retryRefused(ctx context.Context, log *slog.Logger, what string, try func() error) error {
	return retry.Do(ctx, retry.Policy{
		Min: refusedBackoffMin, Max: refusedBackoffMax, Tries: refusedTries,
		Final: func(err error) bool { return !pgdb.Refused(err) },
		OnRetry: func(n int, err error, _ time.Duration) {
			log.WarnContext(ctx, what+" refused by the database; trying again", slog.Int("try", n), slog.Any("error", err))
		},
	}, try)
}

// logFailure logs "<what> failed" with err, unless the executor is
// stopping (the error is then the shutdown's), and returns err.
func (e *Executor) logFailure(log *slog.Logger, what string, err error) error {
	if e.ctx.Err() == nil {
		log.Error(what+" failed", slog.Any("error", err))
	}
	return err
}

// execution is one held claim at work. Its writes go through
// ledger.Execution.Write, which opens every transaction with the fence;
// there is no other path to the database here.
type execution struct {
	e         *Executor
	x         *ledger.Execution
	sessionID string
	steps     int // provider steps so far, across turns: numbers attempt IDs
	// view is the session as read with the claim, for the first promotion.
	view *sessionView
	// started is when the execution's loop of turns began (FairShare).
	started time.Time
	// responseIDs holds the provider's response ID of the execution's
	// latest attempt, if it reported one (ResponseIDFunc), for its
	// outcome's write: one entry at most (keepResponseID). Only the
	// execution's goroutine touches it.
	responseIDs map[string]string
}

// ErrFenced says that an execution lost its right to write.
var ErrFenced = ledger.ErrFenced

func (ex *execution) logErr(ctx context.Context, log *slog.Logger, what string, err error) {
	switch {
	case errors.Is(err, ledger.ErrFenced):
		// Logged and counted by the ledger.
	case errors.Is(err, errParked):
		// Logged by park; the claim is released below.
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
	default:
		log.ErrorContext(ctx, what+" failed", slog.Any("error", err))
	}
}

// Every write of an execution goes through one of the wrappers below,
// which announce it (announced): the outbox rows it committed go to the
// relay at once, not at its next poll. A write that bypassed them would
// leave its events waiting while the provider works.

// announced runs OnCommitFunc when err says the write committed, and
// returns err.
func (e *Executor) announced(err error) error {
	if err == nil && e.cfg.OnCommitFunc != nil {
		e.cfg.OnCommitFunc()
	}
	return err
}

// The writes in a transaction of the execution's own (writeRetried,
// finishRetried, finishOnce) run on a goroutine of their
// own (onOwnStack): pgx's path through a transaction's statements is
// deeper than anything else an execution calls, and run on the
// execution's goroutine it left the stack 16 KiB for the rest of the
// execution, the waits on its provider in the steps after tool calls
// included (TestParkedToolTurnsKeepEightKiBStacks). The calls sent
// through group commit (writeCall, finishCall…) run on its goroutines
// already. While such a write waits on the database (the pool, a
// retry's pause while the database is away), its execution keeps two
// stacks.

// The writes that record what a dispatch returned retry a transient
// database error while the lease lives (ledger/retry.go); landed says
// whether the write already committed when its commit's answer was lost.

// writeRetried is write, retried.
func (ex *execution) writeRetried(ctx context.Context, landed ledger.LandedFunc, fn func(tx pgx.Tx) error) error {
	var err error
	onOwnStack(func() { err = ex.x.WriteRetried(ctx, ledger.RetryOpts{Landed: landed}, fn) })
	return ex.e.announced(err)
}

// finishRetried is finish, retried.
func (ex *execution) finishRetried(ctx context.Context, landed ledger.LandedFunc, fn func(tx pgx.Tx) error) (bool, error) {
	var released bool
	var err error
	onOwnStack(func() { released, err = ex.x.FinishRetried(ctx, ledger.RetryOpts{Landed: landed}, fn) })
	return released, ex.e.announced(err)
}

// writeCallRetried is ledger.Execution.WriteCallRetried.
func (ex *execution) writeCallRetried(ctx context.Context, landed ledger.LandedFunc, phase ledger.Phase, assistantID string, c ledger.Call, scan func(pgx.Row) error) error {
	return ex.e.announced(ex.x.WriteCallRetried(ctx, ledger.RetryOpts{Landed: landed}, phase, assistantID, c, scan))
}

// finishCallRetried is ledger.Execution.FinishCallRetried.
func (ex *execution) finishCallRetried(ctx context.Context, landed ledger.LandedFunc, phase ledger.Phase, assistantID string, c ledger.Call) (bool, error) {
	released, err := ex.x.FinishCallRetried(ctx, ledger.RetryOpts{Landed: landed}, phase, assistantID, c)
	return released, ex.e.announced(err)
}

// A write made after the turn's context ended (a shutdown past its grace,
// which cancels what still runs) records what the cancellation cut off,
// on a context that outlives it, bounded by afterCancelTimeout; a call
// sent through group commit (writeCallOnce, finishCallOnce) waits for its
// flush whatever its context, bounded by the claims' RoundTripTimeout
// instead (at least the lease). It gets one try: retried for the rest of the lease, it would hold the shutdown
// that long while the database is away. A try that fails leaves the claim
// to expire, and recovery decides from what committed, as after a crash.
const afterCancelTimeout = 10 * time.Second

// afterCancel is the context of a write after ctx was cancelled.
func afterCancel(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), afterCancelTimeout)
}

// writeCallOnce is writeCallRetried's for a write after a cancellation:
// WriteCall, whose one row scan reads.
func (ex *execution) writeCallOnce(ctx context.Context, _ ledger.LandedFunc, phase ledger.Phase, assistantID string, c ledger.Call, scan func(pgx.Row) error) error {
	return ex.e.announced(ex.x.WriteCallScan(ctx, phase, assistantID, c, scan))
}

// finishCallOnce is finishCallRetried's for a write after a cancellation.
func (ex *execution) finishCallOnce(ctx context.Context, _ ledger.LandedFunc, phase ledger.Phase, assistantID string, c ledger.Call) (bool, error) {
	released, err := ex.x.FinishCall(ctx, phase, assistantID, c)
	return released, ex.e.announced(err)
}

// finishOnce is finishRetried's for a write after a cancellation.
func (ex *execution) finishOnce(ctx context.Context, _ ledger.LandedFunc, fn func(tx pgx.Tx) error) (bool, error) {
	var released bool
	var err error
	onOwnStack(func() { released, err = ex.x.Finish(ctx, fn) })
	return released, ex.e.announced(err)
}

// attemptLanded says whether the attempt's outcome is already state.
func attemptLanded(id string, state ledger.AttemptState) ledger.LandedFunc {
	return func(ctx context.Context, tx pgx.Tx) (bool, error) {
		got, err := ledger.ReadAttemptState(ctx, tx, id)
		return got == state, err
	}
}

var wakeRow = outbox.WakeRow

// eventRow is the outbox row of a session event, its outside content cut
// to fit the relay's messages. It is encoded on a goroutine of its own
// (onOwnStack): encoding/json's reflection is among the deepest calls an
// execution makes, and an execution keeps the stack it grew for the
// rest of its life, its waits on its provider included.
func (e *Executor) eventRow(ev envelope.Event) outbox.Row {
	var r outbox.Row
	onOwnStack(func() { r = e.eventRowHere(ev) })
	return r
}

// eventRowHere is eventRow on the caller's goroutine, for callers
// already on a stack of their own.
func (e *Executor) eventRowHere(ev envelope.Event) outbox.Row {
	return outbox.EventRowWithin(e.cfg.Topics.Events, ev, e.cfg.MaxMessageBytes)
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }
