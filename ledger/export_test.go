package ledger

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// GroupCommitCounts reports how many transactions combined several
// sessions, and how many of those failed and were sent again one by one.
func GroupCommitCounts(c *Claims) (combined, separated int64) {
	return c.group.combined.Load(), c.group.separated.Load()
}

// GroupCommitGrouped reports how many calls' writes went out grouped
// with others' (grouped_calls.go).
func GroupCommitGrouped(c *Claims) int64 { return c.group.grouped.Load() }

// GroupCommitQueued reports how many transactions wait in group commit's
// queue for a flush.
func GroupCommitQueued(c *Claims) int {
	queued, _ := c.group.queue.State()
	return queued
}

// GroupCommitMaxInFlight is how many group-commit flushes run at once:
// the renewal's isolation test occupies them all.
const GroupCommitMaxInFlight = maxInFlight

// InputWaitsSQL is the release's look for a waiting input.
const InputWaitsSQL = inputWaitsSQL

// The ledger's statements on attempts and tool_calls, for the plan test.
const (
	OpenCallsSQL     = openCallsSQL
	FinishAttemptSQL = finishAttemptSQL
	// RecordResponseIDSQL and AttemptsAtRiskSQL: the spend at risk.
	RecordResponseIDSQL = recordResponseIDSQL
	AttemptsAtRiskSQL   = attemptsAtRiskSQL
	PruneSQL            = pruneSQL
	PruneSettingsSQL    = pruneSettingsSQL
)

// RolledBack is groupCommit's split decision: whether a failed combined
// transaction certainly rolled back and may be sent again session by
// session.
var RolledBack = rolledBack

// LeaseFrom is when the execution's last write that passed the fence was
// sent; SetLeaseFrom moves it, as if that write were older.
func LeaseFrom(x *Execution) time.Time { return x.leaseStart() }
func SetLeaseFrom(x *Execution, at time.Time) {
	x.leaseFrom.Store(int64(at.Sub(x.claims.epoch)))
}

// The queued writes' general forms (a statement each, after the opening
// ledger queues itself), for the tests of the machinery the Calls share.
func (x *Execution) WriteQueued(ctx context.Context, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) error {
	return x.writeQueued(ctx, phase, assistantMessageID, queue)
}

func (x *Execution) FinishQueued(ctx context.Context, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) (bool, error) {
	return x.finishQueued(ctx, phase, assistantMessageID, queue)
}

func (x *Execution) FinishQueuedRetried(ctx context.Context, opts RetryOpts, phase Phase, assistantMessageID string, queue func(b *pgx.Batch)) (bool, error) {
	return x.finishQueuedRetried(ctx, opts, phase, assistantMessageID, queue)
}

func (c *Claims) AcquireAsRead(ctx context.Context, sessionID, executionID string, read SessionRead, waitingIDs []string,
	phase Phase, assistantMessageID string, queue func(b *pgx.Batch, x *Execution)) (*Execution, error) {
	return c.acquireAsReadQueued(ctx, sessionID, executionID, read, waitingIDs, phase, assistantMessageID, queue)
}

// QueueBeginAttempt queues a new attempt's intent (insertAttemptSQL) on a
// queued write: a reused attempt ID violates the key.
func (x *Execution) QueueBeginAttempt(b *pgx.Batch, p AttemptParams) {
	b.Queue(insertAttemptSQL, p.ID, x.claim.SessionID, x.claim.ExecutionID, p.AssistantMessageID,
		p.Step, p.Provider, p.IdempotencyKey, x.claim.Token, p.RequestHash, p.Model, p.RequestTokens)
}

// QueueFinishAttempt queues FinishAttemptWith's statement.
func QueueFinishAttempt(b *pgx.Batch, id string, state AttemptState, errText string, inputTokens, outputTokens int64, responseID string) {
	b.Queue(finishAttemptSQL, id, string(state), errText, inputTokens, outputTokens, responseID)
}

// NextRenewal is KeepAlive's wait before the next renewal.
var NextRenewal = nextRenewal

// Busy reports whether something holds the execution's write lock: a
// write under way, or one waiting for a connection with it held.
func (x *Execution) Busy() bool {
	if x.mu.TryLock() {
		x.mu.Unlock()
		return false
	}
	return true
}

// SetBeforeResend sets a hook that runs when a claim sent unheard and not
// found is about to be sent again (claimUnheard).
func (c *Claims) SetBeforeResend(f func()) { c.beforeResend = f }

// SetBeforeRenewalAcquire sets a hook that runs when a due renewal is
// about to wait for a pool connection (renewIfDue).
func (c *Claims) SetBeforeRenewalAcquire(f func()) { c.beforeRenewalAcquire = f }
