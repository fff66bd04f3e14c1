package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/internal/pgdb"
)

// The executor's hot path writes in one round trip per transaction: its
// statements are queued in a pgx.Batch that is sent without BEGIN and COMMIT,
// so Postgres runs them in one implicit transaction that commits at the
// batch's end, or rolls back entirely at the first error. Every check that
// must stop the transaction is therefore made by the server, never by Go
// after the fact: the fence raises an error (promptline_fence), a reused ID
// violates a key. Each statement takes its own snapshot (read committed), so
// a statement that follows the session lock sees whatever committed before
// the lock was granted, as in an explicit transaction. The same holds
// inside a Call's SQL function: plpgsql takes a fresh snapshot for each
// statement of a volatile function (the default).
//
// Measured on the end-to-end bench (docs/benchmarks.md): a single-prompt turn
// went from 28 round trips to 3. Queued transactions of several sessions
// are then committed together (groupCommit).

// fencedCode is the SQLSTATE raised by promptline_fence.
const fencedCode = "PLFEN"

// appliedCode is the SQLSTATE raised by promptline_fence (migration
// 00021) when the write's position is already applied under the claim.
const appliedCode = "PLAPP"

// fenceCallSQL opens every write of an execution: it renews the lease,
// sets the phase when $5 is not null, applies the write's position $7
// when it is not null, and raises fencedCode when the claim is lost
// (invariant 5), appliedCode when position $7 is already applied.
const fenceCallSQL = `SELECT promptline_fence($1, $2, $3, $4, $5, $6, $7)`

// ErrNothingWaiting says that AcquireWaiting found no waiting input: no
// claim was taken.
var ErrNothingWaiting = errors.New("nothing waiting")

// AcquireWaiting takes the session's claim for a new execution in phase
// ready, with the next fencing token and a lease computed by the database
// clock, only when an input waits, in one round trip. reads, when not nil,
// queues statements (with their result callbacks, which must be idempotent:
// see groupCommit) that run after the claim in the same transaction; they
// are the execution's first view of the session. Without a claim it
// returns ErrNothingWaiting when no input waits (whether or not a claim
// exists), and ErrClaimHeld when an input waits and a claim exists, live
// or expired. The returned Execution's context is cancelled when it is
// fenced.
func (c *Claims) AcquireWaiting(ctx context.Context, sessionID, executionID string, reads func(b *pgx.Batch)) (*Execution, error) {
	var (
		exists, claimed bool
		waiting         *bool
		cl              Claim
	)
	b := &pgx.Batch{}
	b.Queue(acquireWaitingSQL, sessionID, executionID, c.cfg.OwnerID, c.cfg.Lease.Milliseconds()).
		QueryRow(func(row pgx.Row) error {
			var token *int64
			var expires *time.Time
			if err := row.Scan(&exists, &waiting, &token, &expires); err != nil {
				return err
			}
			// Set, never accumulated: a callback may run twice (groupCommit).
			claimed = token != nil
			if claimed {
				cl.Token, cl.ExpiresAt = *token, *expires
			}
			return nil
		})
	if reads != nil {
		reads(b)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sent := time.Now()
	if err := c.group.send(sessionID, b); err != nil {
		return nil, fmt.Errorf("acquiring claim of %s: %w", sessionID, err)
	}
	switch {
	case !exists:
		return nil, fmt.Errorf("acquiring claim of %s: session %s does not exist", sessionID, sessionID)
	case claimed:
	case waiting == nil || !*waiting:
		return nil, ErrNothingWaiting
	default:
		return nil, ErrClaimHeld
	}
	cl.SessionID, cl.ExecutionID, cl.OwnerID, cl.Phase = sessionID, executionID, c.cfg.OwnerID, PhaseReady
	c.onPhase(&cl, PhaseReady)
	xctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	x := &Execution{claims: c, claim: cl, ctx: xctx, cancel: cancel}
	x.leaseSent(sent)
	return x, nil
}

// A Call is a write of an execution that is one statement: a call of the
// SQL function Func, given the opening's arguments first and Args after
// them. The function must run the opening before anything else: for
// WriteCall, promptline_fence with its seven arguments (the fence opens every
// write, invariant 5); for FinishCallRetried, promptline_finish_open (the
// session's lock, then the fence) and, last, promptline_release_idle,
// whose answer it returns; for Claims.AcquireAsReadCall,
// promptline_claim_as_read with its eight arguments, whose expiry it
// returns. The executor's common turn writes through Calls
// (migration 00018): one statement per transaction where the queued
// writes below sent five or six (docs/benchmarks.md).
type Call struct {
	Func string
	Args []any
}

// callSQL is the statement calling fn with n arguments.
func callSQL(fn string, n int) string {
	var sb strings.Builder
	sb.WriteString("SELECT ")
	sb.WriteString(fn)
	sb.WriteByte('(')
	for i := 1; i <= n; i++ {
		if i > 1 {
			sb.WriteString(", ")
		}
		sb.WriteByte('$')
		sb.WriteString(strconv.Itoa(i))
	}
	sb.WriteByte(')')
	return sb.String()
}

// WriteCall is Write as one statement: c's function, given the fence's
// arguments (setting the phase unless it is empty, and the claim's
// assistant message unless empty) then c.Args, in one implicit
// transaction.
func (x *Execution) WriteCall(ctx context.Context, phase Phase, assistantMessageID string, c Call) error {
	return x.WriteCallScan(ctx, phase, assistantMessageID, c, nil)
}

// WriteCallScan is WriteCall whose function's one row scan reads, when
// not nil (it may run twice: group commit's re-send).
func (x *Execution) WriteCallScan(ctx context.Context, phase Phase, assistantMessageID string, c Call, scan func(row pgx.Row) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fenced.Load() {
		return ErrFenced
	}
	args := append(x.fenceArgs(phase, assistantMessageID, x.nextSeq()), c.Args...)
	b := &pgx.Batch{}
	q := b.Queue(callSQL(c.Func, len(args)), args...)
	if scan != nil {
		q.QueryRow(scan)
	}
	return callError(c.Func, x.sendQueued(ctx, b))
}

// callError names the write's function in err: the error a function
// raises (a constraint, a refusal) says what failed, not in which write.
// ErrFenced stays as it is; errors.Is and errors.As see through the rest.
func callError(fn string, err error) error {
	if err == nil || errors.Is(err, ErrFenced) {
		return err
	}
	return fmt.Errorf("%s: %w", fn, err)
}

// WriteCallRetried is WriteRetried as one statement, sent through group
// commit: c's function, given the fence's arguments (as WriteCall) then
// c.Args. scan, when not nil, reads the function's one row; it may run
// twice (group commit's re-send), and on a first try whose answer was
// lost, on no row (its error is then the caller's to ignore). A transient
// failure is retried while the lease lives, as WriteRetried does: the
// retry calls the function again in an explicit transaction whose fence
// applies the write's position, after the landed check. A retry refused
// by the position (the write landed unheard: scan did not read its row)
// runs opts.Landed in a read of its own, best effort, so that the caller
// may read what the write left.
func (x *Execution) WriteCallRetried(ctx context.Context, opts RetryOpts, phase Phase, assistantMessageID string, c Call, scan func(row pgx.Row) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fenced.Load() {
		return ErrFenced
	}
	seq := x.nextSeq()
	args := append(x.fenceArgs(phase, assistantMessageID, seq), c.Args...)
	sql := callSQL(c.Func, len(args))
	b := &pgx.Batch{}
	q := b.Queue(sql, args...)
	var call *groupedCall
	if scan != nil {
		q.QueryRow(scan)
	} else {
		// A call read by no scan: a flush may group its writes, its
		// opening's row unread as the call's (grouped_calls.go).
		call = &groupedCall{fn: c.Func, args: args}
	}
	err := x.sendQueuedCall(ctx, b, call)
	return callError(c.Func, x.retry(ctx, err, func(ctx context.Context) error {
		err := x.writeLocked(ctx, false, seq, skipLanded(ctx, opts.Landed, func(tx pgx.Tx) error {
			// The retry's own fence applied the position: the call's
			// fence is given none.
			again := slices.Clone(args)
			again[seqArgIndex] = nil
			row := tx.QueryRow(ctx, sql, again...)
			if scan != nil {
				return scan(row)
			}
			var void any
			return row.Scan(&void)
		}))
		if errors.Is(err, errWriteApplied) {
			// The write retried landed.
			if opts.Landed != nil {
				_ = pgdb.InTx(ctx, x.claims.pool, func(tx pgx.Tx) error {
					_, err := opts.Landed(ctx, tx)
					return err
				})
			}
			return x.renewLanded(ctx)
		}
		return err
	}))
}

// renewLanded renews the lease after a write found landed by its retry:
// the refused retry renewed nothing, and the write may be an intent whose
// dispatch comes next, with little of the lease left after the retries.
// A claim found lost is ErrFenced; any other failure is left to the
// renewals (the write did land). x.mu is held.
func (x *Execution) renewLanded(ctx context.Context) error {
	err := x.renewOn(ctx, x.claims.pool)
	if errors.Is(err, ErrFenced) {
		x.markFenced(ctx)
		return ErrFenced
	}
	return nil
}

// ReportPhase reports to ClaimsConfig.OnPhaseFunc a phase that a write's
// own function set (promptline_call_settle sets continue only when no
// call of the step is in flight, which its caller learns from its
// answer).
func (x *Execution) ReportPhase(phase Phase) {
	x.claims.onPhase(&x.claim, phase)
}

// FinishCallRetried is FinishRetried as one statement: c's function, given
// the fence's arguments (as WriteCall) then c.Args, locks the session,
// fences, writes and releases the claim when no input waits, returning
// whether it did. A transient failure is retried while the lease lives,
// as FinishRetried does: the retry calls the function again in an explicit
// transaction, after the landed check (which, the write being there, skips
// the call and only releases).
func (x *Execution) FinishCallRetried(ctx context.Context, opts RetryOpts, phase Phase, assistantMessageID string, c Call) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fenced.Load() {
		return false, ErrFenced
	}
	seq := x.nextSeq()
	sql, args := x.finishCallSQL(phase, assistantMessageID, seq, c)
	b := &pgx.Batch{}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&released) })
	// The batch's callback sets released: it is read after the send
	// returns. In one argument list, Go leaves the order of a variable's
	// read and a call unspecified.
	err = x.sendQueuedCall(ctx, b, &groupedCall{fn: c.Func, args: args})
	released, err = x.finished(released, err)
	err = x.retry(ctx, err, func(ctx context.Context) error {
		var err error
		released, err = x.finishAgain(ctx, phase, assistantMessageID, seq, opts.Landed, func(tx pgx.Tx) error {
			// The call releases (or not) under the session's lock; finishTx
			// then counts the waiting inputs and releases again in the same
			// transaction under the same lock, so it finds what the call
			// found and its answer is the call's (TestWriteRetried's Call
			// cases hold both). finishTx's fence applied the position: the
			// call's own fence is given none.
			again := slices.Clone(args)
			again[seqArgIndex] = nil
			var r bool
			return tx.QueryRow(ctx, sql, again...).Scan(&r)
		})
		return err
	})
	return released, callError(c.Func, err)
}

// FinishCall is FinishCallRetried with one try and no retry: for a write
// after the turn's context ended (a shutdown past its grace), which may
// not hold the shutdown for the rest of the lease.
func (x *Execution) FinishCall(ctx context.Context, phase Phase, assistantMessageID string, c Call) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fenced.Load() {
		return false, ErrFenced
	}
	sql, args := x.finishCallSQL(phase, assistantMessageID, x.nextSeq(), c)
	b := &pgx.Batch{}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&released) })
	err = x.sendQueuedCall(ctx, b, &groupedCall{fn: c.Func, args: args}) // sets released: read after it
	released, err = x.finished(released, err)
	return released, callError(c.Func, err)
}

// finishCallSQL is the statement of a finishing call: c's function given
// the fence's arguments, then c.Args.
func (x *Execution) finishCallSQL(phase Phase, assistantMessageID string, seq int64, c Call) (string, []any) {
	args := append(x.fenceArgs(phase, assistantMessageID, seq), c.Args...)
	return callSQL(c.Func, len(args)), args
}

// writeQueued is a write in one round trip: the fence, which also sets the
// phase (unless it is empty) and the claim's assistant message (unless
// empty), then the statements queue adds (with their result callbacks), in
// one implicit transaction. Production writes through Calls; this general
// form stays for the tests of the machinery the Calls share (group commit,
// the fence's refusal, a rollback).
func (x *Execution) writeQueued(ctx context.Context, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fenced.Load() {
		return ErrFenced
	}
	b := &pgx.Batch{}
	b.Queue(fenceCallSQL, x.fenceArgs(phase, assistantMessageID, x.nextSeq())...)
	queue(b)
	return x.sendQueued(ctx, b)
}

// finishQueued is writeQueued that opens with the session's lock (with
// the fence: promptline_finish_open) and ends with the release of the
// claim when no input waits (promptline_release_idle).
func (x *Execution) finishQueued(ctx context.Context, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) (released bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.finishQueuedLocked(ctx, phase, assistantMessageID, x.nextSeq(), queue)
}

func (x *Execution) finishQueuedLocked(ctx context.Context, phase Phase, assistantMessageID string, seq int64, queue func(b *pgx.Batch)) (released bool, err error) {
	if x.fenced.Load() {
		return false, ErrFenced
	}
	b := &pgx.Batch{}
	b.Queue(finishOpenSQL, x.fenceArgs(phase, assistantMessageID, seq)...)
	queue(b)
	b.Queue(releaseIdleSQL, x.claim.SessionID, x.claim.Token).QueryRow(func(row pgx.Row) error { return row.Scan(&released) })
	err = x.sendQueued(ctx, b) // sets released: read after it
	return x.finished(released, err)
}

// finished ends a finishing write that was sent: a released claim fences
// the execution (it writes no more). x.mu is held.
func (x *Execution) finished(released bool, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	if released {
		x.fenced.Store(true)
		x.cancel()
	}
	return released, nil
}

// fenceArgs are promptline_fence's arguments for this execution's write
// at position seq (and promptline_finish_open's).
func (x *Execution) fenceArgs(phase Phase, assistantMessageID string, seq int64) []any {
	return []any{x.claim.SessionID, x.claim.ExecutionID, x.claim.Token, x.claims.cfg.Lease.Milliseconds(), x.phaseArg(phase), assistantMessageID, seqArg(seq)}
}

// seqArgIndex is the position's index among fenceArgs.
const seqArgIndex = 6

func (x *Execution) sendQueued(ctx context.Context, b *pgx.Batch) error {
	return x.sendQueuedCall(ctx, b, nil)
}

// sendQueuedCall is sendQueued for a batch whose one statement is call
// (groupCommit.sendCall).
func (x *Execution) sendQueuedCall(ctx context.Context, b *pgx.Batch, call *groupedCall) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sent := time.Now()
	err := x.claims.group.sendCall(x.claim.SessionID, b, call)
	if errors.Is(interpretError(err), errFenceRaised) {
		x.markFenced(ctx)
		return ErrFenced
	}
	if err == nil {
		x.leaseSent(sent)
	}
	return err
}

// acquireWaitingSQL locks the session row, and claims with the next token
// when an input waits, in one statement. Its snapshot predates the lock:
// an input committed while it waited for the lock is not seen, and the
// wake admitted with that input brings the session back.
const acquireWaitingSQL = `
WITH s AS (
    SELECT session_id, fencing_token,
           EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.session_id = $1) AS waiting
    FROM sessions WHERE session_id = $1 FOR UPDATE
), c AS (
    INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
    SELECT session_id, $2, $3, fencing_token + 1, 'ready', clock_timestamp() + $4 * interval '1 millisecond'
    FROM s WHERE waiting
    ON CONFLICT (session_id) DO NOTHING
    RETURNING fencing_token, expires_at
), b AS (
    UPDATE sessions SET fencing_token = c.fencing_token FROM c WHERE sessions.session_id = $1
)
SELECT EXISTS (SELECT 1 FROM s), (SELECT waiting FROM s), c.fencing_token, c.expires_at
FROM (SELECT 1) AS one LEFT JOIN c ON true`

// releaseIdleSQL deletes the claim unless an input waits
// (promptline_release_idle, migration 00018); it runs after the session
// lock (finishOpenSQL), so an input admitted concurrently is either seen
// here or admitted after the claim is gone, with its own wake
// (invariant 7).
const releaseIdleSQL = `SELECT promptline_release_idle($1, $2)`

// finishOpenSQL opens a finishing write: the session's lock, then the
// fence (promptline_finish_open, migration 00018).
const finishOpenSQL = `SELECT promptline_finish_open($1, $2, $3, $4, $5, $6, $7)`

const insertAttemptSQL = `
INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
                      idempotency_key, fencing_token, request_hash, state, model, request_tokens)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'started', nullif($10, ''), $11)`

// staleCode is the SQLSTATE raised by promptline_claim_as_read.
const staleCode = "PLSTA"

// ErrStale says that AcquireAsReadCall found the session changed since Peek
// read it: no claim was taken and nothing was written.
var ErrStale = errors.New("session changed since it was read")

// SessionRead is what Peek read of a session, without a claim.
type SessionRead struct {
	Exists  bool
	Claimed bool  // a claim exists: live, expired or quarantined
	Token   int64 // the session's fencing token
}

// Peek reads, without a claim and in one round trip, whether the session
// exists, whether it is claimed and its fencing token, then the statements
// reads queues (their callbacks may run twice, as in AcquireWaiting).
// AcquireAsReadCall later takes the claim only if this read is still true.
func (c *Claims) Peek(ctx context.Context, sessionID string, reads func(b *pgx.Batch)) (SessionRead, error) {
	var r SessionRead
	b := &pgx.Batch{}
	b.Queue(peekSQL, sessionID).Query(func(rows pgx.Rows) error {
		r = SessionRead{} // set, never accumulated
		for rows.Next() {
			r.Exists = true
			if err := rows.Scan(&r.Token, &r.Claimed); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if reads != nil {
		reads(b)
	}
	if err := ctx.Err(); err != nil {
		return SessionRead{}, err
	}
	if err := c.group.send(sessionID, b); err != nil {
		return SessionRead{}, fmt.Errorf("reading session %s: %w", sessionID, err)
	}
	return r, nil
}

// AcquireAsReadCall takes the session's claim and commits the execution's
// first write with it, in one statement: the claim is written straight in
// phase, with assistantMessageID, by promptline_claim_as_read, which the
// function of call (given the execution, whose token is read.Token+1) runs
// first with its eight arguments before its own writes, in the same
// implicit transaction, and whose expiry it returns. The claim is taken
// only if read is still true under the session's lock: the same fencing
// token (no execution since), no claim, and waitingIDs the head of the
// waiting inputs, in admission order (promptline_waiting_head, migration
// 00020: the oldest input, the oldest steers up to a hundred, the oldest
// input that is not a prompt; what the first turn is chosen from).
// Otherwise nothing is written and it returns ErrStale.
//
// It saves the executor a transaction per turn (the claim in phase ready,
// then the first step): docs/benchmarks.md. A crash before its commit
// leaves nothing behind, one after it is the first step's own window.
func (c *Claims) AcquireAsReadCall(ctx context.Context, sessionID, executionID string, read SessionRead, waitingIDs []string,
	phase Phase, assistantMessageID string, call func(x *Execution) Call) (*Execution, error) {
	return c.acquireAsRead(ctx, sessionID, executionID, read, waitingIDs, phase, assistantMessageID,
		func(b *pgx.Batch, x *Execution, claimArgs []any) (*pgx.QueuedQuery, *groupedCall) {
			cl := call(x)
			args := append(claimArgs, cl.Args...)
			q := b.Queue(callSQL(cl.Func, len(args)), args...)
			return q, &groupedCall{fn: cl.Func, args: args} // a flush may group its writes (grouped_calls.go)
		})
}

// acquireAsReadQueued is AcquireAsReadCall with promptline_claim_as_read
// sent as a statement of its own, followed by the statements queue adds
// (given the execution): the general form, kept for the tests of the
// claim's conditions.
func (c *Claims) acquireAsReadQueued(ctx context.Context, sessionID, executionID string, read SessionRead, waitingIDs []string,
	phase Phase, assistantMessageID string, queue func(b *pgx.Batch, x *Execution)) (*Execution, error) {
	return c.acquireAsRead(ctx, sessionID, executionID, read, waitingIDs, phase, assistantMessageID,
		func(b *pgx.Batch, x *Execution, claimArgs []any) (*pgx.QueuedQuery, *groupedCall) {
			q := b.Queue(claimAsReadSQL, claimArgs...)
			queue(b, x)
			return q, nil
		})
}

// acquireAsRead is AcquireAsReadCall's work: open queues the statement
// that claims (given promptline_claim_as_read's arguments) and returns it,
// its one row being the claim's expiry, and, when that statement is a
// call of a function, the call (group commit may group its writes with
// other calls' of its function: grouped_calls.go).
func (c *Claims) acquireAsRead(ctx context.Context, sessionID, executionID string, read SessionRead, waitingIDs []string,
	phase Phase, assistantMessageID string, open func(b *pgx.Batch, x *Execution, claimArgs []any) (*pgx.QueuedQuery, *groupedCall)) (*Execution, error) {
	if !read.Exists || read.Claimed || len(waitingIDs) == 0 {
		return nil, ErrStale
	}
	// The claim is built in the execution, not copied from a local: this
	// frame is on every execution's stack (onPhase).
	xctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	x := &Execution{claims: c, ctx: xctx, cancel: cancel, claim: Claim{SessionID: sessionID, ExecutionID: executionID,
		OwnerID: c.cfg.OwnerID, Token: read.Token + 1, Phase: phase, AssistantMessageID: assistantMessageID}}
	var expires time.Time
	b := &pgx.Batch{}
	q, call := open(b, x, []any{sessionID, executionID, c.cfg.OwnerID, x.claim.Token, c.cfg.Lease.Milliseconds(),
		string(phase), assistantMessageID, waitingIDs})
	q.QueryRow(func(row pgx.Row) error { return row.Scan(&expires) })
	if err := ctx.Err(); err != nil {
		cancel()
		return nil, err
	}
	x.leaseSent(time.Now())
	err := c.group.sendCall(sessionID, b, call)
	if err != nil && !errors.Is(interpretError(err), errStaleRaised) && pgdb.Transient(err) && !pgdb.Refused(err) {
		// An expiry a grouped opening read in a flush that then rolled
		// back is not this claim's: claimLanded sets the one found.
		expires = time.Time{}
		err = c.claimUnheard(ctx, x, b, err)
	}
	if err != nil {
		cancel()
		if errors.Is(interpretError(err), errStaleRaised) {
			return nil, ErrStale
		}
		return nil, fmt.Errorf("acquiring claim of %s with its first write: %w", sessionID, err)
	}
	if !expires.IsZero() { // else found unheard: claimLanded set it
		x.claim.ExpiresAt = expires
	}
	c.onPhase(&x.claim, phase) // after the commit: a refused claim set no phase
	return x, nil
}

// claimUnheard decides a claim with its first write whose send failed
// transiently without the server's refusal: its commit's answer was lost,
// so it may have committed, or may still be running on the server (a
// combined group commit waiting on another session's lock). Left alone,
// the claim, if it landed, would expire with its first attempt's intent
// written, and recovery would call the turn's outcome unknown though
// nothing was dispatched. So, while the lease it would hold lives, it
// looks for the claim (this execution's ID and token: nobody else writes
// them) and returns nil once found: the claim is this execution's. Not
// found, it sends the claim again. The two sends cannot both commit: each
// locks the session's row and requires the token the other raises, so a
// second send behind a first that commits is refused as stale, and the
// claim is then looked for once more. err is the first send's error,
// returned when the lease would end first.
func (c *Claims) claimUnheard(ctx context.Context, x *Execution, b *pgx.Batch, err error) error {
	// Given up, the first send's error is returned, not a later one: the
	// claim may have committed, which the caller must not take for a
	// refusal (nothing committed) and claim again.
	first := err
	backoff := retryBackoffMin
	end := x.leaseStart().Add(c.cfg.Lease)
	for tries := 1; ; tries++ {
		left := time.Until(end)
		if left < retryLastTry || ctx.Err() != nil {
			return first
		}
		wait := min(backoff/2+rand.N(backoff/2), left/2)
		c.cfg.Logger.WarnContext(ctx, "claim with its first write failed transiently; looking for it, and sending it again, while its lease would live",
			x.logAttrs(slog.Int("tries", tries), slog.Duration("after", wait), slog.Any("error", err))...)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return first
		case <-t.C:
		}
		backoff = min(2*backoff, retryBackoffMax)
		found, lerr := c.claimLanded(ctx, x, end)
		switch {
		case lerr != nil:
			err = lerr
			if !pgdb.Transient(lerr) {
				return fmt.Errorf("%w (and looking for the claim: %v)", first, lerr)
			}
			continue
		case found:
			return nil
		}
		if c.beforeResend != nil {
			c.beforeResend()
		}
		err = c.group.send(x.claim.SessionID, copyBatch(b))
		switch {
		case err == nil:
			return nil
		case errors.Is(interpretError(err), errStaleRaised):
			// The first send committed meanwhile, or another claim did:
			// the look tells which (looked at again while the lease
			// lives if it fails).
			found, lerr := c.claimLanded(ctx, x, end)
			switch {
			case lerr != nil:
				err = lerr
				continue
			case found:
				return nil
			}
			return err
		case !pgdb.Transient(err):
			return fmt.Errorf("%w (and sending it again: %v)", first, err)
		}
	}
}

// claimLanded says whether x's claim is in the database and live: the
// fence alone, which also renews the lease (the execution dispatches its
// first request next, and may have spent most of the lease looking). A
// claim gone or expired is not found. The fence ends by end.
func (c *Claims) claimLanded(ctx context.Context, x *Execution, end time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	err := x.renewOn(ctx, c.pool)
	switch {
	case errors.Is(err, ErrFenced):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking for the claim sent unheard: %w", err)
	}
	x.claim.ExpiresAt = x.leaseStart().Add(c.cfg.Lease) // no later than the database's
	return true, nil
}

const peekSQL = `
SELECT fencing_token, EXISTS (SELECT 1 FROM claims c WHERE c.session_id = s.session_id)
FROM sessions s WHERE s.session_id = $1`

const claimAsReadSQL = `SELECT promptline_claim_as_read($1, $2, $3, $4, $5, $6, $7, $8)`

// phaseArg is the fence's phase argument: nil keeps the claim's phase, a
// phase sets it (and is reported to OnPhaseFunc).
func (x *Execution) phaseArg(phase Phase) *string {
	if phase == "" {
		return nil
	}
	x.claims.onPhase(&x.claim, phase)
	s := string(phase)
	return &s
}
