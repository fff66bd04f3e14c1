package ledger

import "time"

// GroupCommitCounts reports how many transactions combined several
// sessions, and how many of those failed and were sent again one by one.
func GroupCommitCounts(c *Claims) (combined, separated int64) {
	return c.group.combined.Load(), c.group.separated.Load()
}

// The ledger's statements on attempts and tool_calls, for the plan test.
const (
	OpenCallsSQL     = openCallsSQL
	FinishAttemptSQL = finishAttemptSQL
	// RecordResponseIDSQL and AttemptsAtRiskSQL: the spend at risk.
	RecordResponseIDSQL = recordResponseIDSQL
	AttemptsAtRiskSQL   = attemptsAtRiskSQL
	SettleCallSQL       = settleCallSQL
	StartCallSQL        = startCallSQL
	PruneSQL            = pruneSQL
	PruneSettingsSQL    = pruneSettingsSQL
)

// RolledBack is groupCommit's split decision: whether a failed combined
// transaction certainly rolled back and may be sent again session by
// session.
var RolledBack = rolledBack

// LeaseFrom is when the execution's last write that passed the fence was
// sent; SetLeaseFrom moves it, as if that write were older.
func LeaseFrom(x *Execution) time.Time        { return x.leaseFrom }
func SetLeaseFrom(x *Execution, at time.Time) { x.leaseFrom = at }
