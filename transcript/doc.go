// Package transcript owns the tables messages and message_parts: a
// session's user, assistant and tool messages and their parts (text, tool
// calls). Every statement that writes them lives here, behind a typed
// function taking a *Params struct, and every writer calls it: the
// executor (a step's assistant message, its answer and parts, a tool
// result, a failed turn), recovery (a reconciled turn's assistant message
// errored) and the ledger's side of an operator's resolution (a resolved
// call's tool message). One exception stays with the executor:
// promotion's promoteSQL writes inputs, messages and message_parts in one
// statement and is listed in docs/design.md's Table owners as a
// cross-table statement.
//
// It also reads the transcript back as a provider sees it (History,
// QueueHistory; CheckHistory says whether it can be read, for recovery's
// evidence), what the executor reads of a turn it continues or fails
// and what an operator's resolution reads of the turn it settles
// (turn.go), and defines the JSON of a tool_call part
// (ToolCallPart) for the writer and the reader alike.
//
// The package holds no policy: what to write, and when, is the caller's
// decision. Each function runs in the caller's transaction (pgx.Tx) so
// that the transcript commits with the state change it belongs to; the
// statements the executor sends in one round trip have a Queue form that
// adds the same statement, with the same arguments, to the caller's
// pgx.Batch. Errors are the driver's, unwrapped: the caller says what it
// was doing; a missing row that a caller expects is a found flag instead
// (errors.go's interpretError, the package's one test of pgx.ErrNoRows).
// One error is the package's own: a stored part that cannot be read back
// (UnreadablePartError, naming the message and part).
//
// Rules kept here, once for every writer:
//
//   - An assistant message is pending until it is completed (its answer
//     stored) or errored (its turn failed); only a pending message changes
//     status, so a late writer (a retried write, recovery after the
//     executor) never reopens or rewrites a settled one.
//   - A tool message is written completed, with its one text part; an
//     operator's finding that a call ran replaces the result (invariant
//     12), completing the message whatever it said before.
package transcript
