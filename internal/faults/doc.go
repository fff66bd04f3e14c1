// Package faults holds crash points for the crash tests. Hit(name) kills the
// process with SIGKILL when the binary was built with the "faults" build tag
// and PROMPTLINE_FAULT names that point; Stall(name) blocks the calling
// goroutine for good instead; Crash() kills the process whatever
// PROMPTLINE_FAULT says (the scripted provider's /crash directive). In
// normal builds all compile to nothing.
// PROMPTLINE_FAULT=point@duration stops the goroutine that hits the point
// for that long before the kill, while the rest of the process runs on.
//
// Points: see the constants below.
package faults

// Crash points, in the order a prompt meets them.
const (
	// AdmissionAfterCommit: the admission transaction committed, the Kafka
	// offset not yet marked.
	AdmissionAfterCommit = "admission.after-commit"
	// RelayAfterPublish: outbox rows published, not yet marked.
	RelayAfterPublish = "relay.after-publish"
	// ClaimAsRead: the session read for a plain prompt's first turn, the
	// claim taken with that turn not yet committed: nothing of the
	// execution is durable.
	ClaimAsRead = "claim.as-read"
	// ClaimAfterAcquire: a claim committed alone (phase ready: inputs
	// other than plain prompts, or the session changed since the read),
	// nothing promoted.
	ClaimAfterAcquire = "claim.after-acquire"
	// ProviderAfterIntent: inputs promoted and the provider attempt's
	// intent committed (phase unknown), the request not yet sent.
	ProviderAfterIntent = "provider.after-intent"
	// ToolAfterIntent: a side-effecting tool call's intent committed, the
	// tool not yet run.
	ToolAfterIntent = "tool.after-intent"
	// IdempotentToolAfterIntent: an idempotent tool call's intent committed,
	// the tool not yet run.
	IdempotentToolAfterIntent = "idempotent-tool.after-intent"
	// ToolAfterRun: a tool call ran and returned, its result not yet
	// committed: the call's effect happened, the ledger says started.
	ToolAfterRun = "tool.after-run"
	// ToolStall: not a crash point: the tool call's goroutine blocks for
	// good, ignoring its context, right before the tool runs (Stall): a
	// tool stuck in a system call.
	ToolStall = "tool.stall"
	// StepAfterSettle: the last tool result of a step committed with the
	// phase continue, the next provider step not begun.
	StepAfterSettle = "step.after-settle"
	// TurnAfterFail: a turn's failure committed (assistant message
	// errored, phase safe, turn.failed) with the claim kept because inputs
	// wait, the next promotion not begun.
	TurnAfterFail = "turn.after-fail"
	// RecoveryAfterTakeover: recovery took over an expired claim, its
	// decision not yet committed (it commits in the same transaction, so
	// the next pass finds the claim as it was).
	RecoveryAfterTakeover = "recovery.after-takeover"
	// RecoveryAfterToken: a paced recovery decision (--recovery-rate)
	// took its token from the fleet's bucket, in the decision's
	// transaction, not yet committed: the rollback returns the token.
	RecoveryAfterToken = "recovery.after-token"
)
