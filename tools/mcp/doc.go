// Package mcp mounts the tools of Model Context Protocol servers as
// promptline tools (docs/tools.md, "Tools from MCP servers").
//
// A server is reached over stdio (a command promptline starts) or over
// streamable HTTP (a URL). At start, Connect lists each server's tools and
// turns every one into a tools.Tool named SERVER__TOOL, with the server's
// own input schema and a class read from the tool's annotations:
// readOnlyHint true, or idempotentHint true with destructiveHint false, is
// tools.Idempotent; anything else, no annotations included, is
// tools.SideEffecting. An operator's Override may make a tool stricter at
// will, and looser only when it says so (Override.Force).
//
// Every call carries the ledger's idempotency key and the claim's fencing
// token in the request's _meta (MetaIdempotencyKey, MetaFencingToken), so
// that a server can deduplicate a re-run idempotent call and refuse a
// stale writer. A call that could not be sent (the server is down, its
// command does not start) wraps tools.ErrNotRun; a call whose connection
// broke after it was sent returns a plain error: its outcome is unknown.
package mcp
