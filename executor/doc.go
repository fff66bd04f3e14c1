// Package executor runs a session's turns: the Executor claims the
// session, promotes its waiting inputs (promotion.go), calls the provider
// step by step (step.go), runs tool calls under their permission policy
// (tool_call.go, permission.go), parks a turn on a permission ask and
// resumes it with the reply, takes recovery's continuations up
// (continuation.go), stores the answer and announces it through the
// outbox; a turn that cannot go on fails with its reason
// (turn_failure.go). Every write goes through the claim's fence
// (ledger).
//
// The Executor's lifecycle is every background service's
// (internal/startstop): Start, then Stop (graceful, within StopGrace) or
// StopNow (hard); a stop lets each run settle its turn and release its
// claim, with a wake where input waits.
//
// When the process that admitted a prompt also owns its session's wakes
// partition, the consumer starts the session at once (WakeLocal, a local
// wake); the wake from Kafka is then recognised (TakeLocal) and joins that
// run (local_wakes.go).
//
// DeltaPublisher sends the live text of streaming providers to
// session-deltas (delta_publisher.go, delta_stream.go).
package executor
