// Package tools is the public Go API for the tools a model may call during a
// promptline session: what a tool declares (Spec), what it receives (Call),
// what it returns (Result), the Registry the executor looks tools up in, and
// a few built-in tools.
//
// The package knows nothing of Postgres or Kafka. The executor, for each tool
// call the model requests:
//
//  1. looks the tool up (Registry.Lookup) and validates the input against
//     the tool's JSON Schema (Registry.Validate); an *InputError goes back to
//     the model as a failed call, it is not a crash;
//  2. resolves the call's Class (ResolveClass: a tool that implements
//     ClassResolver decides per input, otherwise Spec().Class);
//  3. commits the call's intent, with that class and the idempotency key, to
//     the ledger;
//  4. runs the tool (Tool.Run) with the idempotency key and the fencing
//     token of its claim in the Call;
//  5. commits the result.
//
// # The contract of Run
//
// A Result is an outcome the tool is sure of. Result.IsError means the tool
// ran, or refused to run, and failed cleanly; the output goes back to the
// model, which may correct itself. An error from Run means the tool could
// not run or does not know what happened (say, a connection lost after the
// request was sent). The executor records such a call failed or unknown.
// Run wraps ErrNotRun when it knows that no side effect started (say, the
// connection was refused); the executor may then record the call failed
// rather than unknown.
//
// # Classes, and what happens after a crash (design promise P4)
//
// An uncertain side effect is never repeated automatically. A call whose
// intent is committed and whose result is not is "unknown" after a crash.
// If its class is Idempotent, promptline may run it again with the same
// Call.IdempotencyKey; the tool must make that safe (the key reaches the
// receiving system, or the effect is naturally idempotent). If its class is
// SideEffecting, the call is recorded unknown and reported, never re-run.
// When in doubt, declare SideEffecting.
//
// Every call also carries the fencing token of the execution's claim. A
// process paused between committing an intent and dispatching the call may
// still dispatch it after another executor has taken the session over; a
// tool that reaches an outside system should pass the token on (http_request
// sends it as X-Fencing-Token) so that the system can refuse a stale call.
//
// # Concurrency
//
// A Registry is safe for concurrent use. Tools are run concurrently, by
// several sessions at once, so Run must be safe for concurrent use too.
package tools
