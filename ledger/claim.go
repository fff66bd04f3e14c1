package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/outbox"
)

// Phase is the execution phase stored on the claim; recovery decides by it.
type Phase string

const (
	// PhaseReady: claim held, nothing uncertain dispatched since the last
	// settled point.
	PhaseReady Phase = "ready"
	// PhaseUnknown: a provider attempt or a side-effecting tool call was
	// dispatched and its outcome is not recorded.
	PhaseUnknown Phase = "unknown"
	// PhaseContinue: a step ended durably and needs another provider turn.
	PhaseContinue Phase = "continue"
	// PhaseSafe: the turn is complete.
	PhaseSafe Phase = "safe"
)

var (
	// ErrFenced says that an execution lost its claim: its token is stale or
	// its lease ran out. It must stop at once and dispatch nothing more.
	ErrFenced = errors.New("execution fenced: claim lost")
	// ErrClaimHeld says that another execution holds the session's claim
	// (live or expired): the wake is the holder's (or recovery's) to handle.
	ErrClaimHeld = errors.New("claim held by another execution")
	// ErrNotExpired says that a takeover found the claim changed or still live.
	ErrNotExpired = errors.New("claim changed or not expired")
)

// Claim is a claim row.
type Claim struct {
	SessionID          string
	ExecutionID        string
	OwnerID            string
	Token              int64
	Phase              Phase
	AssistantMessageID string
	ExpiresAt          time.Time
	// ExpiresNotFinite is ExpiryNegativeInfinity or ExpiryInfinity when
	// expires_at holds that instead of a time (ExpiresAt is then zero), ""
	// when it holds a time. No writer of promptline sets one (every lease
	// is the clock plus a duration), but the column admits them: a hand
	// edit, a restore or a repair script may leave one. Reading such a
	// claim never fails; recovery quarantines it (its lease is neither
	// live nor expired by any clock).
	ExpiresNotFinite string
}

// The values of expires_at that are not a time (Claim.ExpiresNotFinite).
const (
	ExpiryNegativeInfinity = "-infinity"
	ExpiryInfinity         = "infinity"
)

// setExpiry sets the claim's expiry from expires_at as read.
func (c *Claim) setExpiry(t pgtype.Timestamptz) {
	c.ExpiresAt, c.ExpiresNotFinite = expiryOf(t)
}

// expiryOf splits expires_at as read into a time and, when it holds none,
// the value it holds instead.
func expiryOf(t pgtype.Timestamptz) (time.Time, string) {
	switch t.InfinityModifier {
	case pgtype.NegativeInfinity:
		return time.Time{}, ExpiryNegativeInfinity
	case pgtype.Infinity:
		return time.Time{}, ExpiryInfinity
	}
	return t.Time, ""
}

// expiryArg is an expiry as a query argument, the value the column holds,
// infinite or not: a compare-and-swap on expires_at, a scan's position.
func expiryArg(at time.Time, notFinite string) pgtype.Timestamptz {
	switch notFinite {
	case ExpiryNegativeInfinity:
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	case ExpiryInfinity:
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: at, Valid: true}
}

// ClaimsConfig configures Claims.
type ClaimsConfig struct {
	// Lease is how long a claim lives without renewal. Defaults to 30s.
	Lease time.Duration
	// OwnerID names this process in claims. Defaults to "unknown-owner".
	OwnerID string
	// RoundTripTimeout bounds each wait for the database that has no
	// deadline of its caller: a group commit's flush (its senders wait
	// for the outcome whatever their contexts), and an execution's write
	// or renewal called without one. Past it the connection is closed and
	// the write is in doubt, as after a lost connection (the landed
	// check, or the claim left to expire). Without it a silent network
	// partition holds the write, and every session whose write shares its
	// flush, until the kernel gives the connection up (about 15 minutes).
	// Never shorter than Lease: a write given up while its lease lives
	// would be retried (retry.go) while the one given up may still be
	// running on the server, behind a lock, and land after the retry's
	// landed check, applied twice; given up once the lease as this
	// process counts it has ended, it is never retried, and if it lands
	// late, it is the write's only landing. Defaults to
	// pgdb.RoundTripTimeoutDefault, or Lease when that is longer.
	RoundTripTimeout time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
	// OnFencedFunc runs each time a write is fenced (the fenced-writes
	// metric). Defaults to nothing.
	OnFencedFunc func()
	// OnWriteRetryFunc runs each time a write of an execution is retried
	// after a transient database error (the write-retries metric).
	// Defaults to nothing.
	OnWriteRetryFunc func()
	// OnRenewedFunc runs after each successful renewal. Defaults to nothing.
	OnRenewedFunc func()
	// OnPhaseFunc runs when an execution sets a phase (inside its
	// transaction, before commit), for tracing and tests. Defaults to nothing.
	OnPhaseFunc func(c Claim, phase Phase)
}

// LeaseDefault is ClaimsConfig.Lease when it is zero.
const LeaseDefault = 30 * time.Second

// Claims acquires and releases session claims.
type Claims struct {
	pool  *pgxpool.Pool
	cfg   ClaimsConfig
	group *groupCommit
	// epoch is the origin of the executions' leaseFrom.
	epoch time.Time
	// beforeResend, a test's hook, runs in claimUnheard just before it
	// sends a claim again, once it did not find it.
	beforeResend func()
	// beforeRenewalAcquire, a test's hook, runs in renewIfDue when a due
	// renewal is about to wait for a pool connection.
	beforeRenewalAcquire func()
}

// NewClaims returns Claims.
func NewClaims(pool *pgxpool.Pool, config *ClaimsConfig) *Claims {
	cfg := *config
	cfg.Lease = cmp.Or(cfg.Lease, LeaseDefault)
	cfg.OwnerID = cmp.Or(cfg.OwnerID, "unknown-owner")
	cfg.RoundTripTimeout = max(cmp.Or(cfg.RoundTripTimeout, pgdb.RoundTripTimeoutDefault), cfg.Lease)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Claims{pool: pool, cfg: cfg, group: newGroupCommit(pool, cfg.RoundTripTimeout), epoch: time.Now()}
}

// Lease is the configured lease.
func (c *Claims) Lease() time.Duration { return c.cfg.Lease }

// RoundTripTimeout is the configured bound of a wait for the database
// with no deadline of its caller (ClaimsConfig.RoundTripTimeout): an
// executor's reads under a claim take it too.
func (c *Claims) RoundTripTimeout() time.Duration { return c.cfg.RoundTripTimeout }

// Execution is the right to write a session: a held claim. All its writes
// go through Write.
type Execution struct {
	claims *Claims
	claim  Claim
	ctx    context.Context
	cancel context.CancelFunc
	fenced atomic.Bool
	mu     sync.Mutex // serialises Write: one statement stream per execution
	// leaseFrom is when the last write or renewal that passed the fence
	// was sent, on the claims' monotonic clock (leaseStart, leaseSent):
	// the lease, as the database counts it, lasts at least until then
	// plus the lease (retry.go). Atomic, not guarded by mu: renewals do
	// not take mu (renewIfDue).
	leaseFrom atomic.Int64
	// seq is the position last given to a write of this execution
	// (nextSeq): the fence applies each position once, in order, so that a
	// write whose answer was lost can never land after its retry or a later
	// write (migration 00021; docs/design.md, crash window "stale-write").
	// A retry keeps its write's position. Guarded by mu.
	seq int64
}

// leaseStart is leaseFrom as a time (with its monotonic reading).
func (x *Execution) leaseStart() time.Time {
	return x.claims.epoch.Add(time.Duration(x.leaseFrom.Load()))
}

// leaseSent records that a write or renewal sent at at passed the fence,
// unless one sent later already did.
func (x *Execution) leaseSent(at time.Time) {
	d := int64(at.Sub(x.claims.epoch))
	for {
		cur := x.leaseFrom.Load()
		if d <= cur || x.leaseFrom.CompareAndSwap(cur, d) {
			return
		}
	}
}

// nextSeq gives the next write its position. x.mu is held.
func (x *Execution) nextSeq() int64 {
	x.seq++
	return x.seq
}

// seqArg is the fence's position argument: nil (not counted) for 0.
func seqArg(seq int64) *int64 {
	if seq == 0 {
		return nil
	}
	return &seq
}

// Claim returns the claim as acquired.
func (x *Execution) Claim() Claim { return x.claim }

// ExecutionID and Token are the claim's, without a copy of the whole
// Claim in the caller's frame (see onPhase).
func (x *Execution) ExecutionID() string { return x.claim.ExecutionID }

// Token is the claim's fencing token.
func (x *Execution) Token() int64 { return x.claim.Token }

// onPhase reports a phase to cfg.OnPhaseFunc, a hook of tests. Not
// inlined, on purpose: a Claim passed by value is spilled to the caller's
// frame, and the callers are on the stack of every execution, whose
// deepest call sits just under the 8 KiB past which each of ten thousand
// executions in flight keeps a 16 KiB stack (docs/benchmarks.md, "A few
// bytes of a frame"): the outgoing copy lives here, where only a test
// with the hook pays for it.
//
//go:noinline
func (c *Claims) onPhase(cl *Claim, phase Phase) {
	if f := c.cfg.OnPhaseFunc; f != nil {
		f(*cl, phase)
	}
}

// Context is cancelled when the execution is fenced (or released).
func (x *Execution) Context() context.Context { return x.ctx }

// Fenced reports whether the execution has lost its claim.
func (x *Execution) Fenced() bool { return x.fenced.Load() }

// Write runs fn in a transaction that opens with the fence: one conditional
// statement on the claim (token matches, lease live by the database clock,
// not quarantined) that also renews the lease (promptline_fence, in the
// schema). When the claim is lost it raises an error: the transaction rolls
// back, the execution's context is cancelled, and Write returns ErrFenced,
// now and for every later call.
func (x *Execution) Write(ctx context.Context, fn func(tx pgx.Tx) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	var seq int64 // a renewal writes nothing: not counted
	if fn != nil {
		seq = x.nextSeq()
	}
	return x.writeLocked(ctx, false, seq, fn)
}

// writeLocked is writeTx that marks the execution fenced when the claim is
// lost; seq is the write's position (0: not counted). x.mu is held.
func (x *Execution) writeLocked(ctx context.Context, lockSession bool, seq int64, fn func(tx pgx.Tx) error) error {
	if x.fenced.Load() {
		return ErrFenced
	}
	err := x.writeTx(ctx, lockSession, "", "", seq, fn)
	if errors.Is(err, ErrFenced) {
		x.markFenced(ctx)
	}
	return err
}

// writeTx runs fn in a transaction that opens with the fence (after the
// session's lock when lockSession), which also sets the phase and the
// claim's assistant message unless they are empty, and applies position
// seq (unless 0). It returns ErrFenced when the claim is lost, and
// errWriteApplied when position seq is already applied (only a retry can
// find that: the write it retries landed), without marking the execution
// fenced. x.mu is held.
func (x *Execution) writeTx(ctx context.Context, lockSession bool, phase Phase, assistantMessageID string, seq int64, fn func(tx pgx.Tx) error) error {
	if x.fenced.Load() {
		return ErrFenced
	}
	p := x.phaseArg(phase)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, x.claims.cfg.RoundTripTimeout)
		defer cancel()
	}
	sent := time.Now()
	err := pgdb.InTx(ctx, x.claims.pool, func(tx pgx.Tx) error {
		if lockSession {
			if _, _, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: x.claim.SessionID}); err != nil {
				return fmt.Errorf("locking session: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, fenceCallSQL, x.claim.SessionID, x.claim.ExecutionID, x.claim.Token, x.claims.cfg.Lease.Milliseconds(), p, assistantMessageID, seqArg(seq)); err != nil {
			switch ierr := interpretError(err); {
			case errors.Is(ierr, errFenceRaised):
				return ErrFenced
			case errors.Is(ierr, errAppliedRaised):
				return errWriteApplied
			}
			return fmt.Errorf("fence: %w", err)
		}
		if fn == nil {
			return nil
		}
		return fn(tx)
	})
	if err == nil {
		x.leaseSent(sent)
	}
	return err
}

func (x *Execution) markFenced(ctx context.Context) {
	if x.fenced.Swap(true) {
		return
	}
	x.cancel()
	x.claims.cfg.Logger.WarnContext(ctx, "execution fenced: claim lost, stopping",
		slog.String("session_id", x.claim.SessionID), slog.String("execution_id", x.claim.ExecutionID),
		slog.Int64("fencing_token", x.claim.Token))
	if f := x.claims.cfg.OnFencedFunc; f != nil {
		f()
	}
}

// SetPhase records the phase inside a Write transaction, together with the
// state change it describes (invariant 8).
func (x *Execution) SetPhase(ctx context.Context, tx pgx.Tx, phase Phase, assistantMessageID string) error {
	_, err := tx.Exec(ctx, setPhaseSQL, x.claim.SessionID, x.claim.Token, string(phase), assistantMessageID)
	if err != nil {
		return fmt.Errorf("setting phase %s: %w", phase, err)
	}
	x.claims.onPhase(&x.claim, phase)
	return nil
}

// Renew extends the lease; an expired claim cannot be renewed (ErrFenced).
// It is the fence alone, one statement and so a transaction of its own
// on a pool connection, ended by ctx: not group-committed, where it would
// queue for group commit's few flushes behind other sessions' writes that
// wait on a lock, and where a stop could not end it (docs/benchmarks.md,
// "renewals group-committed: measured and not kept").
//
// It does not take x.mu: it is no positioned write (the fence's position
// is left as it is), and the claim's row lock orders it against a write
// under way. So a write waiting for a connection, or a write's retries
// waiting out their backoff (retry.go, holding x.mu), never keep the
// lease from being renewed, and a renewal never holds a write back but
// for its one statement on the claim's row. Held, x.mu made a turn's
// answer wait behind a renewal's wait for a connection at ten thousand
// turns in flight, and let a write's retries run the lease out
// (docs/benchmarks.md).
func (x *Execution) Renew(ctx context.Context) error {
	err := x.renewOn(ctx, x.claims.pool)
	if errors.Is(err, ErrFenced) {
		x.renewalFenced(ctx) // the pool's connection is back
	}
	return err
}

// execer is a pool or one of its connections.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// renewOn sends the fence alone on db: no phase, no position. A claim
// found lost is ErrFenced, not yet marked (renewalFenced): the caller
// marks it once it holds no connection, since marking waits for x.mu,
// which a write of the execution may hold while it waits for one.
func (x *Execution) renewOn(ctx context.Context, db execer) error {
	if x.fenced.Load() {
		return ErrFenced
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, x.claims.cfg.RoundTripTimeout)
		defer cancel()
	}
	sent := time.Now()
	if _, err := db.Exec(ctx, fenceCallSQL, x.fenceArgs("", "", 0)...); err != nil {
		if errors.Is(interpretError(err), errFenceRaised) {
			return ErrFenced
		}
		return fmt.Errorf("renewing the lease: %w", err)
	}
	x.leaseSent(sent)
	if f := x.claims.cfg.OnRenewedFunc; f != nil {
		f()
	}
	return nil
}

// renewalFenced marks the execution fenced after its renewal found the
// claim gone, unless a write of its own released it: that write holds
// x.mu until it has marked the execution (finishTx), so the release is
// told from a lost claim once x.mu is free.
func (x *Execution) renewalFenced(ctx context.Context) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.fenced.Load() {
		x.markFenced(ctx)
	}
}

// renewIfDue renews the lease when it is due, every (lease/3) after the
// last write or renewal that passed the fence was sent (leaseFrom): every
// write renews the lease, so an execution that writes often sends no
// renewal. It takes a pool connection first, then looks again (a write
// may have landed meanwhile). It returns the wait before it should be
// called again.
func (x *Execution) renewIfDue(ctx context.Context, every time.Duration) (next time.Duration, err error) {
	due := func() time.Duration { return every - time.Since(x.leaseStart()) }
	if wait := due(); wait > 0 {
		return wait, nil
	}
	began := time.Now()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, x.claims.cfg.RoundTripTimeout)
		defer cancel()
	}
	if f := x.claims.beforeRenewalAcquire; f != nil {
		f()
	}
	conn, err := x.claims.pool.Acquire(ctx)
	if err != nil {
		return nextRenewal(every, time.Since(began)), fmt.Errorf("renewing the lease: %w", err)
	}
	if wait := due(); wait > 0 { // a write landed while this waited for the connection
		conn.Release()
		return wait, nil
	}
	err = x.renewOn(ctx, conn)
	conn.Release()
	if errors.Is(err, ErrFenced) {
		x.renewalFenced(ctx)
	}
	return nextRenewal(every, time.Since(began)), err
}

// KeepAlive renews the lease when it falls due (renewIfDue: every lease/3
// after the last write that passed the fence) until ctx ends, the
// execution is fenced or stop is called; stop ends it and waits for a
// renewal under way (so it must not be called from inside a renewal:
// OnRenewedFunc, the logger). It runs on a timer, not a goroutine of its
// own: between renewals nothing waits (each renewal runs in the timer's
// goroutine), so an execution waiting on its provider costs one
// goroutine, not two (docs/benchmarks.md, "the lease renewed on a timer").
func (x *Execution) KeepAlive(ctx context.Context) (stop func()) {
	every := max(x.claims.cfg.Lease/3, time.Millisecond)
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
		running sync.WaitGroup // the renewal scheduled or under way
	)
	live := func() bool { return ctx.Err() == nil && x.ctx.Err() == nil }
	renew := func() {
		defer running.Done()
		mu.Lock()
		goOn := !stopped
		mu.Unlock()
		if !goOn || !live() {
			return
		}
		next, err := x.renewIfDue(ctx, every)
		if err != nil && !errors.Is(err, ErrFenced) && ctx.Err() == nil {
			x.claims.cfg.Logger.WarnContext(ctx, "renewing claim failed; retrying at the next tick",
				slog.String("session_id", x.claim.SessionID), slog.Any("error", err))
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped && live() {
			running.Add(1)
			t.Reset(next)
		}
	}
	// The first renewal falls due every after the claim's own send, not
	// after this call: a claim found only after its commit's answer was
	// lost (claimUnheard) may have spent most of its lease looking.
	first := max(every-time.Since(x.leaseStart()), 0)
	mu.Lock()
	running.Add(1)
	t = time.AfterFunc(first, renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		if t.Stop() {
			running.Done() // the scheduled renewal will not run
		}
		mu.Unlock()
		running.Wait()
	}
}

// nextRenewal is the wait before the next renewal, one that took took
// having begun every before it: renewals keep their beat of every, so a
// slow one (a renewal may take up to the statement timeout) does not push
// the next one later, and one slower than every is followed at once, as a
// ticker's waiting tick was.
func nextRenewal(every, took time.Duration) time.Duration {
	return max(every-took, 0)
}

// Finish runs fn behind the fence, with the session row locked first, and
// then, in the same transaction, releases the claim if no input waits: the
// turn's last write and the release cost one commit. released is false
// when inputs wait; the claim is kept for them.
func (x *Execution) Finish(ctx context.Context, fn func(tx pgx.Tx) error) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.finishLocked(ctx, "", "", x.nextSeq(), fn)
}

func (x *Execution) finishLocked(ctx context.Context, phase Phase, assistantMessageID string, seq int64, fn func(tx pgx.Tx) error) (released bool, err error) {
	released, err = x.finishTx(ctx, phase, assistantMessageID, seq, fn)
	if errors.Is(err, ErrFenced) {
		x.markFenced(ctx)
	}
	return released, err
}

// finishTx is Finish's transaction (the fence setting phase, as writeTx);
// ErrFenced is returned unmarked. x.mu is held.
func (x *Execution) finishTx(ctx context.Context, phase Phase, assistantMessageID string, seq int64, fn func(tx pgx.Tx) error) (released bool, err error) {
	err = x.writeTx(ctx, true, phase, assistantMessageID, seq, func(tx pgx.Tx) error {
		released = false // set afresh: a retry runs this again
		if fn != nil {
			if err := fn(tx); err != nil {
				return err
			}
		}
		var waiting bool
		if err := tx.QueryRow(ctx, inputWaitsSQL, x.claim.SessionID).Scan(&waiting); err != nil {
			return fmt.Errorf("looking for a waiting input: %w", err)
		}
		if waiting {
			return nil
		}
		if _, err := tx.Exec(ctx, releaseSQL, x.claim.SessionID, x.claim.Token); err != nil {
			return fmt.Errorf("deleting claim: %w", err)
		}
		released = true
		return nil
	})
	if err != nil {
		return false, err
	}
	if released {
		x.fenced.Store(true)
		x.cancel()
	}
	return released, nil
}

// ReleaseOpts says how to release.
type ReleaseOpts struct {
	// Stopping: the execution will not run more turns (shutdown, partition
	// revoked), so release even when inputs wait, writing Wake in the same
	// transaction.
	Stopping bool
	// Wake is the outbox row written when inputs wait at a stopping release.
	Wake outbox.Row
}

// Release deletes the claim unless inputs wait and the execution is not
// stopping; then it returns released=false and the caller runs another
// turn. A stopping release with waiting inputs writes opts.Wake in the same
// transaction (invariant 7). The session row is locked first, so an input
// admitted concurrently is either seen here or admitted after the claim is
// gone, with its own wake.
//
// released is true only once the release committed. After an error it is
// false, and the execution is not marked fenced: a failed commit released
// nothing, and one whose answer was lost (the ambiguous commit) may have
// released or not; the next write's fence tells (the claim gone refuses
// it, and the execution stops), as for a retried write (retry.go).
func (x *Execution) Release(ctx context.Context, opts ReleaseOpts) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	err = x.writeLocked(ctx, true, x.nextSeq(), func(tx pgx.Tx) error {
		var waiting bool
		if err := tx.QueryRow(ctx, inputWaitsSQL, x.claim.SessionID).Scan(&waiting); err != nil {
			return fmt.Errorf("looking for a waiting input: %w", err)
		}
		if waiting && !opts.Stopping {
			return nil
		}
		if _, err := tx.Exec(ctx, releaseSQL, x.claim.SessionID, x.claim.Token); err != nil {
			return fmt.Errorf("deleting claim: %w", err)
		}
		released = true
		if waiting {
			return outbox.Insert(ctx, tx, opts.Wake)
		}
		return nil
	})
	if err != nil {
		// Rolled back, or its commit failed or went unanswered: not known
		// to be released.
		return false, err
	}
	if released {
		x.fenced.Store(true) // released: no more writes
		x.cancel()
	}
	return released, err
}

// Takeover replaces an expired claim by compare-and-swap on (session,
// execution, owner, expiry, not quarantined), bumping the fencing token so
// that the old execution is fenced the moment this commits. It runs inside
// tx; recovery (and tests standing in for it) decide in the same
// transaction what to do with the session.
func Takeover(ctx context.Context, tx pgx.Tx, old Claim, executionID, ownerID string, lease time.Duration) (Claim, error) {
	token, found, err := admission.LockSession(ctx, tx, &admission.LockSessionParams{SessionID: old.SessionID})
	if err != nil {
		return Claim{}, fmt.Errorf("locking session %s: %w", old.SessionID, err)
	}
	if !found {
		return Claim{}, fmt.Errorf("locking session %s: no such session", old.SessionID)
	}
	nc := old
	// Past the claim's token as well as the session's: they are equal but
	// for a restore of one table older than the other (or a hand edit),
	// and the token is handed to tools and providers as the writer's,
	// which may fence on it: a takeover must never repeat the token of the
	// holder it fences, nor go below it.
	nc.ExecutionID, nc.OwnerID, nc.Token = executionID, ownerID, max(token, old.Token)+1
	err = tx.QueryRow(ctx, takeoverSQL, old.SessionID, old.ExecutionID, old.OwnerID, expiryArg(old.ExpiresAt, old.ExpiresNotFinite),
		executionID, ownerID, nc.Token, lease.Milliseconds()).Scan(&nc.ExpiresAt)
	nc.ExpiresNotFinite = "" // the new lease is the clock plus lease
	if errors.Is(interpretError(err), errNotFound) {
		return Claim{}, ErrNotExpired
	}
	if err != nil {
		return Claim{}, fmt.Errorf("taking over %s: %w", old.SessionID, err)
	}
	if err := admission.BumpFencingToken(ctx, tx, &admission.BumpFencingTokenParams{SessionID: old.SessionID, Token: nc.Token}); err != nil {
		return Claim{}, fmt.Errorf("raising the fencing token of %s: %w", old.SessionID, err)
	}
	return nc, nil
}

// Get reads a session's claim; ok is false when there is none.
func Get(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sessionID string) (c Claim, ok bool, err error) {
	var phase string
	var asst *string
	var expires pgtype.Timestamptz
	err = q.QueryRow(ctx, getClaimSQL, sessionID).Scan(&c.SessionID, &c.ExecutionID, &c.OwnerID, &c.Token, &phase, &asst, &expires)
	if errors.Is(interpretError(err), errNotFound) {
		return Claim{}, false, nil
	}
	if err != nil {
		return Claim{}, false, fmt.Errorf("reading claim of %s: %w", sessionID, err)
	}
	c.Phase = Phase(phase)
	c.setExpiry(expires)
	if asst != nil {
		c.AssistantMessageID = *asst
	}
	return c, true, nil
}

const setPhaseSQL = `
UPDATE claims SET phase = $3, assistant_message_id = coalesce(nullif($4, ''), assistant_message_id)
WHERE session_id = $1 AND fencing_token = $2`

// inputWaitsSQL says whether an input waits; waiting_inputs (a view) is
// the one definition of a waiting input. It stops at the first: a count
// read the whole queue at every release check, in time linear in its
// depth (TestReleaseLooksAtOneWaitingInput).
const inputWaitsSQL = `SELECT EXISTS (SELECT 1 FROM waiting_inputs WHERE session_id = $1)`

const releaseSQL = `DELETE FROM claims WHERE session_id = $1 AND fencing_token = $2`

// takeoverSQL judges expiry by the clock at the statement (as the fence
// does, migration 00009), not at the transaction's start, which may lie
// before the wait for the session's lock; the new lease counts from it.
const takeoverSQL = `
UPDATE claims SET execution_id = $5, owner_id = $6, fencing_token = $7, write_seq = 0,
       expires_at = clock_timestamp() + $8 * interval '1 millisecond', renewed_at = clock_timestamp(), acquired_at = clock_timestamp()
WHERE session_id = $1 AND execution_id = $2 AND owner_id = $3 AND expires_at = $4
  AND expires_at <= clock_timestamp() AND quarantine_reason IS NULL
RETURNING expires_at`

const getClaimSQL = `
SELECT session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at
FROM claims WHERE session_id = $1`
