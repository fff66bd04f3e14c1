// Package ledger is the durable record of executions: the claim that makes
// one execution the single writer of a session (with its fencing token,
// phase and lease), and, in the next issue, provider attempts and tool
// calls.
//
// Invariants this package enforces (DESIGN.md numbering):
//
//   - 4. Acquire inserts a claim only when the session has none; it never
//     replaces a live or an expired claim. Only Takeover (recovery's
//     compare-and-swap on session, execution, owner, expiry, not
//     quarantined) replaces an expired one, and it bumps the token.
//   - 5. Every write of an execution goes through Execution.Write, whose
//     transaction opens with one conditional statement on the claim: the
//     token matches and expires_at > clock_timestamp() (the database
//     clock when the fence runs, not the transaction's start, which may lie
//     before a wait for a lock inside the transaction), which also renews
//     the lease, counted from that same clock. Zero rows means fenced: the
//     transaction rolls back, the execution's context is cancelled and
//     every later Write fails with ErrFenced at once, without touching the
//     database.
//   - 6. An expired claim never renews itself: renewal is that same
//     statement, which requires a live lease.
//   - 7. Release locks the session row first (admission upserts it, so the
//     two serialise), and never deletes the claim while inputs wait unless
//     the wake is written in the same transaction.
//
// Lock order, everywhere: the session row before the claim row. Admission
// takes only the session row; Write takes only the claim row.
package ledger
