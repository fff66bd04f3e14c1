package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/pgdb"
)

// The writes that record what a dispatch returned (a provider's answer, a
// tool's result, a failed turn) know their outcome: nothing about it is
// uncertain. A transient database error on such a write (a lost
// connection, a server shutting down, a deadlock, a serialization failure,
// a timeout: pgdb.Transient) says nothing about the write either, so it is
// retried, with backoff, for as long as the lease lives (docs/design.md,
// invariant 13). Left unretried, the turn would be left for recovery,
// which can only call its outcome unknown. The intents a dispatch waits
// for (a promotion, of a queued turn or of a continuation or a permission
// reply, and a later step's intent) are retried the same way: nothing was
// dispatched, so an intent found landed lets its step run (the claim with
// the first turn has its own: claimUnheard).
//
// A retry is a new transaction that opens with the fence like every write
// (invariant 5): a claim lost meanwhile (taken over, or its lease run out
// while the database was away) refuses it, and the execution stops. The
// retries end, leaving the error to the caller and the claim to expire for
// recovery (P1), when the lease as this process last renewed it would end
// before the next one: the lease is counted from the moment the last
// successful write was sent, which is no later than the database's own
// count.
//
// The commit whose answer was lost may have committed (the ambiguous
// commit), or may still be running on the server: a combined group commit
// can wait on a lock in another session's part, not yet at this session's
// fence, with nothing to tell it that its client is gone. So a retry keeps
// its write's position (Execution.seq), which the fence applies once: a
// retry whose write landed is refused (errWriteApplied: landed), and once
// the retry passed, the lost write is refused should it still arrive (crash
// window "stale-write"). RetryOpts.Landed, reading in the retry's
// transaction, says still whether the write is already there, and the
// retry then commits only the renewal. A
// finishing write that committed with its release has deleted the claim:
// the retry's fence refuses it, and Landed (read then without the fence,
// the claim being gone) tells that release from a lost claim.

// LandedFunc reports whether the write being retried already committed.
// It runs in the retry's transaction after the fence, or, for a finishing
// write whose claim is gone, in a transaction of its own.
type LandedFunc func(ctx context.Context, tx pgx.Tx) (bool, error)

// RetryOpts says how a write is retried after a transient error.
type RetryOpts struct {
	// Landed says whether the write already committed. Defaults to nil:
	// the write is idempotent (running it twice changes nothing more than
	// running it once) and is simply run again.
	Landed LandedFunc
}

// Backoff between retries: doubled from retryBackoffMin up to
// retryBackoffMax, each wait drawn in [wait/2, wait).
// No retry starts with less than retryLastTry of the lease left.
const (
	retryBackoffMin = 50 * time.Millisecond
	retryBackoffMax = time.Second
	retryLastTry    = 20 * time.Millisecond
)

// WriteRetried is Write that retries a transient failure while the lease
// lives (opts.Landed detects a write that already committed).
func (x *Execution) WriteRetried(ctx context.Context, opts RetryOpts, fn func(tx pgx.Tx) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	seq := x.nextSeq()
	err := x.writeLocked(ctx, false, seq, fn)
	return x.retry(ctx, err, func(ctx context.Context) error {
		err := x.writeLocked(ctx, false, seq, skipLanded(ctx, opts.Landed, fn))
		if errors.Is(err, errWriteApplied) {
			// The write retried landed; it may be an intent whose
			// request is sent next.
			return x.renewLanded(ctx)
		}
		return err
	})
}

// FinishRetried is Finish that retries a transient failure while the lease
// lives. A retry whose write already committed only releases the claim if
// no input waits; one that finds the claim gone and the write there
// reports released: the write that landed released it. (Or it did not,
// and the claim was taken over after its lease ran out: the execution
// stops either way, and recovery decides by the phase the write set.)
func (x *Execution) FinishRetried(ctx context.Context, opts RetryOpts, fn func(tx pgx.Tx) error) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	seq := x.nextSeq()
	released, err = x.finishLocked(ctx, "", "", seq, fn)
	err = x.retry(ctx, err, func(ctx context.Context) error {
		var err error
		released, err = x.finishAgain(ctx, "", "", seq, opts.Landed, fn)
		return err
	})
	return released, err
}

// finishQueuedRetried is finishQueued that retries a transient failure
// while the lease lives, as FinishRetried does. A retry runs the queued
// statements in an explicit transaction, after the landed check.
func (x *Execution) finishQueuedRetried(ctx context.Context, opts RetryOpts, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	seq := x.nextSeq()
	released, err = x.finishQueuedLocked(ctx, phase, assistantMessageID, seq, queue)
	err = x.retry(ctx, err, func(ctx context.Context) error {
		var err error
		released, err = x.finishAgain(ctx, phase, assistantMessageID, seq, opts.Landed, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			queue(b)
			return tx.SendBatch(ctx, b).Close()
		})
		return err
	})
	return released, err
}

// retry runs again, while err is transient and the lease lives, and
// returns the last error. x.mu is held.
//
// A last error that is a refusal (pgdb.Refused: a deadlock, a
// serialization failure, a lock not granted in time) says that its own try
// did not commit, and a caller may take it as "nothing committed" and
// write again under a new position (as the executor's retryRefused does
// for a claim; its writes under a claim are not run again: this loop
// already retried the refusal for the lease). That holds
// only when no earlier try is in doubt: a try whose connection was lost
// may still be committing on the server, holding the claim's row, which is
// just what makes the next try's fence time out; once it commits, a write
// under a new position would pass the fence and be applied beside it (a
// second turn promoted while the first one's intent stands). So after a
// try in doubt, a last refusal is returned as an error that is not one
// (errInDoubt), and the caller leaves the claim to expire: recovery
// decides from what committed.
func (x *Execution) retry(ctx context.Context, err error, again func(ctx context.Context) error) (final error) {
	doubt := inDoubt(err)
	defer func() {
		if doubt && pgdb.Refused(final) {
			final = &errInDoubt{err: final}
		}
	}()
	backoff := retryBackoffMin
	// Renewals go on beside the retries (they take no lock: renewOn) and
	// move the lease's end; the retries end within one lease of their
	// start all the same. A "transient" error that never heals (a
	// statement always past its timeout, a lock held for good) would
	// otherwise be retried for as long as the renewals succeed, the claim
	// live and the session wedged, out of recovery's reach.
	last := time.Now().Add(x.claims.cfg.Lease)
	for tries := 1; ; tries++ {
		if err == nil || errors.Is(err, ErrFenced) || !pgdb.Transient(err) || ctx.Err() != nil {
			return err
		}
		end := x.leaseStart().Add(x.claims.cfg.Lease)
		if end.After(last) {
			end = last
		}
		wait := backoff/2 + rand.N(backoff/2)
		left := time.Until(end)
		wait = min(wait, left/2) // a last try before the end, not a give-up one backoff early
		if left < retryLastTry {
			x.claims.cfg.Logger.WarnContext(ctx, "write failed transiently and the lease ends before a retry; the claim is left to expire for recovery",
				x.logAttrs(slog.Int("tries", tries), slog.Any("error", err))...)
			return fmt.Errorf("%w (tried %d times; the lease ends before another retry)", err, tries)
		}
		x.claims.cfg.Logger.WarnContext(ctx, "write failed transiently; retrying while the lease lives",
			x.logAttrs(slog.Int("tries", tries), slog.Duration("after", wait), slog.Any("error", err))...)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		backoff = min(2*backoff, retryBackoffMax)
		if f := x.claims.cfg.OnWriteRetryFunc; f != nil {
			f()
		}
		actx, cancel := context.WithDeadline(ctx, end)
		err = again(actx)
		cancel()
		doubt = doubt || inDoubt(err)
	}
}

// inDoubt says whether a try that failed with err may have committed, or
// may still: no server error says that it rolled back.
func inDoubt(err error) bool {
	return err != nil && !errors.Is(err, ErrFenced) && !rolledBack(err)
}

// errInDoubt is a refusal that ended a write's retries after one of its
// tries was in doubt. It hides the refusal's class on purpose (no Unwrap):
// the write may have committed all the same (retry).
type errInDoubt struct{ err error }

func (e *errInDoubt) Error() string {
	return e.err.Error() + " (an earlier try's outcome is not known: it may have committed)"
}

func (x *Execution) logAttrs(attrs ...any) []any {
	return append([]any{slog.String("session_id", x.claim.SessionID), slog.String("execution_id", x.claim.ExecutionID),
		slog.Int64("fencing_token", x.claim.Token)}, attrs...)
}

// skipLanded is fn, unless landed says that the write already committed.
func skipLanded(ctx context.Context, landed LandedFunc, fn func(tx pgx.Tx) error) func(tx pgx.Tx) error {
	if landed == nil || fn == nil {
		return fn
	}
	return func(tx pgx.Tx) error {
		ok, err := landed(ctx, tx)
		if err != nil {
			return fmt.Errorf("checking whether the write committed: %w", err)
		}
		if ok {
			return nil
		}
		return fn(tx)
	}
}

// finishAgain is a retry of a finishing write: fenced, with the session
// locked first, the write unless it landed, and the release when no input
// waits. A fence that finds the claim gone while the write is there is the
// release that landed with it.
func (x *Execution) finishAgain(ctx context.Context, phase Phase, assistantMessageID string, seq int64, landed LandedFunc, fn func(tx pgx.Tx) error) (released bool, err error) {
	released, err = x.finishTx(ctx, phase, assistantMessageID, seq, skipLanded(ctx, landed, fn))
	if errors.Is(err, errWriteApplied) {
		// The write retried landed and kept the claim (one that released
		// it left no claim: the fence refuses, below): inputs waited, and
		// only this execution promotes them, so they wait still.
		return false, nil
	}
	if !errors.Is(err, ErrFenced) || landed == nil {
		if errors.Is(err, ErrFenced) {
			x.markFenced(ctx)
		}
		return released, err
	}
	var ok bool
	if lerr := pgdb.InTx(ctx, x.claims.pool, func(tx pgx.Tx) error {
		var err error
		ok, err = landed(ctx, tx)
		return err
	}); lerr != nil {
		return false, fmt.Errorf("checking whether the write committed: %w", lerr)
	}
	if !ok {
		x.markFenced(ctx)
		return false, ErrFenced
	}
	x.fenced.Store(true) // released by the write that landed: no more writes
	x.cancel()
	return true, nil
}
