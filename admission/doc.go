// Package admission takes prompts and permission replies into Postgres
// exactly once, with their outbox wake in the same transaction (P2;
// docs/design.md, invariants 1-3). Admitter admits a batch in one
// transaction and classifies every prompt (Admitted, Duplicate, Conflict);
// AdmitReply admits a permission reply and the input that resumes its
// parked turn. Group combines the batches that several partitions have at
// hand at once into one transaction.
//
// Admission owns the sessions, inputs, permission_requests and
// permission_grants tables, and the kinds of input (KindPrompt,
// KindPermissionReply, KindContinuation) that the executor reads. The
// executor and recovery write these tables through its functions, in
// their own transactions (session.go, input.go, permission_request.go),
// and read through them: the executor an ask's reply, the session's
// standing grants and the turn the ask parked, recovery whether a
// continuation waits and how many inputs are quarantined;
// docs/design.md's Table owners lists the writes still made elsewhere. The
// Kafka handler that feeds it is pipeline.Consumer; replay feeds it a
// topic range outside the live group.
package admission
