// Package ledger is the durable record of executions: the claim that makes
// one execution the single writer of a session (with its fencing token,
// phase and lease), the provider attempts and tool calls of each step
// (intent committed before dispatch, result before anything acts on it:
// P4), and the Pruner that deletes the ledger rows of executions nothing
// can need again.
//
// Two write paths share the fence. Execution.Write and Execution.Finish
// run an interactive transaction: use them when the work reads and decides
// between its statements. WriteCall, FinishCallRetried and
// Claims.AcquireAsReadCall send a whole transaction known in advance as one
// statement, a call of a SQL function that opens with the fence (with the
// session's lock for a finish, or the claim), in one implicit transaction
// and one round trip, which group commit may merge with other sessions'
// (groupcommit.go): the executor's common turn (a plain prompt's promotion
// with its attempt's intent, and its answer with the release; migration
// 00018). When a flush holds several calls of one of the common turn's
// functions, each sends its opening alone, in its place, and their writes
// go together in one statement at the end (grouped_calls.go, migration
// 00024): the group's write functions do not open with the fence, and are
// sent only after every opening of their group. A Call's function must open as the Call's doc says; the
// executor's functions are held to the owners' statements they stand for
// by a test (executor's TestTurnCallsWriteWhatTheStatementsWrite).
//
// Invariants this package enforces (docs/design.md numbering):
//
//   - 4. AcquireWaiting and AcquireAsReadCall insert a claim only when the
//     session has none; they never replace a live or an expired claim. Only Takeover (recovery's
//     compare-and-swap on session, execution, owner, expiry, not
//     quarantined) replaces an expired one, and it bumps the token.
//   - 5. Every write of an execution goes through Execution.Write (or a
//     Call, whose SQL function runs the same statement first:
//     promptline_fence, alone or after the session's lock in
//     promptline_finish_open), whose transaction opens with one
//     conditional statement on the claim: the
//     token matches and expires_at > clock_timestamp() (the database
//     clock when the fence runs, not the transaction's start, which may lie
//     before a wait for a lock inside the transaction), which also renews
//     the lease, counted from that same clock, and applies the write's
//     position (Execution.seq; a retry keeps its write's): a position
//     already applied raises PLAPP and changes nothing, so a lost write
//     still running on the server never lands after its retry or a later
//     write (crash window "stale-write"). Zero rows means fenced: the
//     transaction rolls back, the execution's context is cancelled and
//     every later Write fails with ErrFenced at once, without touching the
//     database. The ledger cannot see inside a Call's function: each
//     function production calls is held to its opening by
//     TestCallsOpenAsTheirDocSays (a zombie's call writes nothing, a stale
//     read claims nothing).
//   - 6. An expired claim never renews itself: renewal is that same
//     statement, which requires a live lease.
//   - 7. Release locks the session row first (admission upserts it, so the
//     two serialise), and never deletes the claim while inputs wait unless
//     the wake is written in the same transaction. A Call that releases
//     does both through the ledger's functions: promptline_finish_open
//     first, promptline_release_idle last.
//   - 13. A write that records what a dispatch returned (WriteRetried,
//     FinishRetried, FinishCallRetried) retries a transient database
//     error (pgdb.Transient) with backoff while the lease lives, each
//     retry behind the fence, so that a claim lost meanwhile still stops
//     the writer. A retry keeps its write's position: its fence refuses it
//     when the write landed (taken as landed), and once it passed, the
//     write it retries is refused should it still arrive. It also asks
//     RetryOpts.Landed whether the write already committed, so it is never
//     applied twice; past the lease the error goes to the caller and the
//     claim is left to expire for recovery. A combined group commit whose
//     outcome is unknown is never sent again session by session.
//   - 12. An unknown tool call or attempt keeps its outcome; only an
//     operator's finding (resolve.go, called by recovery.Resolve with the
//     session locked and no claim) replaces it, audited.
//
// Lock order, everywhere: the session row before the claim row. Admission
// takes only the session row; Write takes only the claim row.
package ledger
