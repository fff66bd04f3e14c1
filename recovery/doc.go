// Package recovery takes over expired claims and decides, from durable
// evidence only, what is safe: clear, re-wake, continue, reconcile or
// quarantine (docs/design.md, P1, P5, P6). It also re-wakes sessions whose wakes
// were lost. Every consumer runs it; correctness comes from
// compare-and-swap, not from a leader.
//
// Invariants it keeps (docs/design.md numbering):
//
//   - 4/9. An expired claim is taken over only by compare-and-swap on
//     (session, execution, owner, expiry, not quarantined), bumping the
//     fencing token, and the takeover, the decision, a continuation input
//     and the outbox rows commit in one transaction: a crash during
//     recovery leaves the claim for the next pass, a second recovery of the
//     same execution finds nothing to take over.
//   - P4. An attempt or a side-effecting tool call that was started and
//     never settled is reconciled (marked unknown, the turn failed with
//     reason outcome_unknown), never replayed. Exceptions, recorded as the
//     decision's rule: a started idempotent tool call is run again with its
//     idempotency key (idempotent_tool_retry); a started provider attempt
//     of a provider that honours idempotency keys is sent again with its
//     key (idempotent_provider_retry).
//   - P5. A continuation input's ID is recovery-continue-<execution ID>
//     (recovery-continue <execution ID> when a prompt holds that one; the
//     input's kind, continuation, says what it is, invariant 14):
//     admitting it twice is an exact retry, a no-op.
//   - 7. Every decision that clears a claim writes a wake when inputs wait.
//   - 10. Scans are bounded by the batch size, ordered (expiry, session),
//     and isolate per-row failures: a row that fails validation, or whose
//     decision fails deterministically, is quarantined with its reason and
//     skipped by later scans until an operator releases it.
//   - 13. A decision that fails with a transient database error (a lost
//     connection, a lock or statement timeout, a deadlock, a serialization
//     failure: pgdb.Transient) rolls back and leaves the claim as it was for
//     the next pass; it is logged and counted, never quarantined.
//   - 12. An unknown outcome changes only by an operator's audited finding
//     (Resolve, `consumer session resolve`): under the session row's lock,
//     never while a claim holds the session or a newer turn superseded the
//     call's, and its continuation (resolve-continue-<round>-<target>) is
//     admitted once however often the finding is given.
//   - Pacing (Config.Rate, --recovery-rate). A decision that wakes a
//     session, and each re-wake of a lost wake, takes a token from the
//     fleet's bucket (rate.go) in its own transaction, so a rollback
//     returns it; the bucket is read FOR UPDATE SKIP LOCKED, so no pass
//     waits for it while holding a lock, and what a pass cannot pace
//     within its interval stays as it was for the next pass.
//
// A decision is a pure function of the claim and its evidence (Decide):
// the pass gathers the evidence under the session's lock, decides, then
// applies in the same transaction; a plan (Recoverer.Plan, `consumer
// recovery plan`) applies the same function to evidence read in one read
// only snapshot and writes nothing.
//
// A cap per session (Config.MaxPerSession): a decision that would run a
// session's turn again (continued, rewoken) when the session's turns were
// run again MaxPerSession times within the window is a quarantine with
// reason recovery_cap instead. The count is part of the evidence (Cap),
// read from the recoveries table, so it survives restarts and every
// process counts the same; only recoveries decided after the last release
// of a capped claim of the session count.
//
// A claim of a session whose transcript cannot be read back (a tool
// call's stored part that does not decode: transcript.CheckHistory, part
// of the evidence) is quarantined whatever its phase, reason
// "transcript unreadable: ...": every provider step sends that history,
// so any decision that runs the session again would fail at every lease.
// Its release is refused until the part is repaired.
//
// Decisions: cleared (phase safe), superseded (the claim's assistant
// message is older than a message of a newer turn, or than a step its own
// turn went on to; not merely than the errored rest of its turn), rewoken
// (phase ready), continued (phase continue, or an idempotent retry),
// reconciled (phase unknown), quarantined.
package recovery
